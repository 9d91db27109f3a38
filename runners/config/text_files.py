"""A config file that is not text (random bytes, another encoding than UTF-8, NUL bytes): which one.

Hydra reads a group's option file (``conf/<group>/<option>.yaml``; ``sweeps/<name>.yaml`` for
``+sweeps=<name>``, through the search path) as UTF-8 and, when it is not, raises a bare
``UnicodeDecodeError`` that names no file. ``unreadable(overrides)`` finds the file: first those the
overrides choose, then every file of ``conf/``, and returns the ``ConfigError`` naming it, the offending
byte and its offset (the same message ``trustbench sweep`` gives for a sweep file).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from runners.config.validate import ConfigError
from runners.paths import repo_root


def check_text(path: Path, key: str) -> None:
    """Raise ``ConfigError(key, ...)`` naming ``path`` unless it is UTF-8 text without NUL bytes."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        where = f"byte 0x{data[err.start]:02x} at offset {err.start}"
        raise ConfigError(key, f"config file {path} is not UTF-8 text ({where}); save it as UTF-8 YAML") from None
    if b"\0" in data:
        raise ConfigError(key, f"config file {path} is not text (a NUL byte at offset {data.index(0)})")


def _candidates(overrides: Iterable[str]) -> list[tuple[Path, str]]:
    conf, found = repo_root() / "conf", []
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and value:
            found += [(root / key.replace(".", "/") / f"{value}.yaml", key) for root in (conf, repo_root())]
    found += [(p, p.parent.relative_to(conf).as_posix()) for p in sorted(conf.rglob("*.yaml"))]
    return found


def unreadable(overrides: Iterable[str]) -> ConfigError:
    """The error naming the config file that is not text (module docstring)."""
    for path, key in _candidates(overrides):
        try:
            if path.is_file():
                check_text(path, key)
        except ConfigError as err:
            return err
        except OSError:
            continue
    return ConfigError("defaults", "a config file is not UTF-8 text (none of conf/ or the overrides' files)")
