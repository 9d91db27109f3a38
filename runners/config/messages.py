"""One line for a configuration mistake, whatever raised it: the key or the file, and the reason.

- ``ConfigError``: as is (``config key 'objective.eps': must be > 0 (got -0.1)``);
- a YAML syntax error (a sweep file, a user's ``conf/launcher/cluster.yaml``): the file, the line
  and column, and the parser's problem, instead of PyYAML's traceback;
- an unknown option of a config group (``algorithm=nope``): the group and its options;
- Hydra's composition errors keep their reason in ``__cause__`` (``Error merging override
  trainer.total_steps=1e9`` says nothing more): the OmegaConf reason and key are appended.

Credentials in URIs are masked (``runners.redact``).

    from runners.config.messages import describe
    print(f"trustbench: configuration error: {describe(err)}")
"""

from __future__ import annotations

from runners.redact import redact


def describe(err: BaseException) -> str:
    import yaml

    if isinstance(err, yaml.MarkedYAMLError):
        return redact(_describe_yaml(err))
    missing = _describe_missing_option(err)
    if missing:
        return redact(missing)
    text = _one_line(str(err))
    cause = err.__cause__
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cause, OmegaConfBaseException):
        reason = _one_line((str(getattr(cause, "msg", None) or cause).splitlines() or [""])[0])
        key = getattr(cause, "full_key", None)
        text = f"config key '{key}': {reason} ({text})" if key else f"{text}: {reason}"
    return redact(text)


def _describe_missing_option(err: BaseException) -> str | None:
    """``algorithm=nope``: the group, the option and the group's options (Hydra's message spans a dozen
    lines, its config search path included, and lists the component schemas as options)."""
    from hydra.errors import MissingConfigException

    where = getattr(err, "missing_cfg_file", None) if isinstance(err, MissingConfigException) else None
    if not where or "/" not in where or err.options is None:
        return None
    group, _, option = where.rpartition("/")
    options = ", ".join(o for o in err.options if not o.startswith("schema_"))
    return f"config group '{group}' has no option '{option}'; its options: {options}"


def _describe_yaml(err) -> str:
    mark = err.problem_mark or err.context_mark
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a YAML file"
    problem = err.problem or err.context or "invalid YAML"
    context = ""
    if err.context and err.problem and err.context_mark is not None:
        context = f" ({err.context} at line {err.context_mark.line + 1})"
    return f"YAML syntax error in {where}: {problem}{context}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
