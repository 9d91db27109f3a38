"""``runners.redact``: credentials of URIs masked by the grammar of RFC 3986, not by a guess.

The reference is the RFC's own character sets (section 2.2, 2.3 and 3.2.1), written out here, and
Python's ``urllib.parse.urlsplit`` (an independent parser) for what the host and password of the
masked URI are.
"""

from __future__ import annotations

import json
import string
from urllib.parse import quote, urlsplit

import pytest
import yaml

from runners.redact import redact, redact_values

# RFC 3986 section 3.2.1: userinfo = *( unreserved / pct-encoded / sub-delims / ":" )
# section 2.3 and 2.2
UNRESERVED = string.ascii_letters + string.digits + "-._~"
SUB_DELIMS = "!$&'()*+,;="
USERINFO_CHARS = UNRESERVED + SUB_DELIMS + ":"
PCT_ENCODED = [f"%{b:02X}" for b in range(256)] + ["%2f", "%3a", "%40"]  # HEXDIG: either case


def _check(uri: str, expected: str) -> None:
    """``uri`` redacted is ``expected`` (written by hand from the RFC's split), and urllib reads the
    same host, port and path in both, the password (if any) as ``***``."""
    out = redact(uri)
    assert out == expected, (uri, out)
    parts, masked = urlsplit(uri), urlsplit(out)
    assert (masked.hostname, masked.port, masked.path) == (parts.hostname, parts.port, parts.path), (uri, out)
    assert masked.password in (None, "***") and "***" in masked.username + (masked.password or ""), (uri, out)


@pytest.mark.parametrize("ch", list(USERINFO_CHARS))
def test_every_userinfo_character_in_the_password_is_masked(ch):
    _check(f"http://bob:pa{ch}ss{ch}@mlflow.example.org:5000/api", "http://bob:***@mlflow.example.org:5000/api")
    _check(f"https://bob:{ch}@host/", "https://bob:***@host/")  # the password is that one character
    _check(f"https://bob:{ch}{ch}{ch}@host", "https://bob:***@host")


@pytest.mark.parametrize("ch", [c for c in USERINFO_CHARS if c != ":"])  # the first ":" ends the user
def test_every_userinfo_character_in_the_user_is_kept_and_the_password_masked(ch):
    _check(f"http://b{ch}ob{ch}:S3cr3t@host:8080/x", f"http://b{ch}ob{ch}:***@host:8080/x")


@pytest.mark.parametrize("ch", [c for c in USERINFO_CHARS if c != ":"])
def test_every_userinfo_character_in_a_user_without_password_is_masked_whole(ch):
    _check(f"https://tok{ch}en@host/p", "https://***@host/p")
    _check(f"https://{ch}@host/p", "https://***@host/p")


def test_percent_encoded_octets_in_user_and_password():
    for pct in PCT_ENCODED:
        _check(f"http://u{pct}x:p{pct}w@host/", f"http://u{pct}x:***@host/")
        _check(f"http://t{pct}k@host/", "http://***@host/")
    every = quote("".join(chr(c) for c in range(32, 127)), safe="")  # a password of all printable ASCII
    _check(f"http://alice:{every}@host:1/", "http://alice:***@host:1/")


def test_characters_a_uri_may_not_hold_are_masked_too():
    """Not legal unencoded, but a user may type them: the userinfo ends at the last "@" (as urllib
    reads it), quotes and backslashes do not end it."""
    for secret in ("p@ss", "pässwörd", 'p"ss', "p\\ss", "p{|}<>^`ss", "p@@"):
        _check(f"http://bob:{secret}@host/", "http://bob:***@host/")


def test_several_uris_in_one_string_each_masked():
    text = "a=http://u1:p1@h1/x, b=https://u2:p'2@h2:1 c=[sqlite:///x.db,http://t3@h3,http://u4:p4@h4]"
    assert (
        redact(text) == "a=http://u1:***@h1/x, b=https://u2:***@h2:1 c=[sqlite:///x.db,http://***@h3,http://u4:***@h4]"
    )


@pytest.mark.parametrize(
    "quoted",
    [
        "'http://bob:se'cret@h:5000'",
        '"http://bob:se\'cret@h:5000"',
        'tracking.uri="http://bob:se\'cret@h:5000"',
        "tracking.uri='http://bob:se\\'cret@h:5000'",  # Hydra's quoted override, escaped quote
        "`http://bob:se'cret@h:5000`",
        "<http://bob:se'cret@h:5000>",
    ],
)
def test_a_uri_inside_quotes(quoted):
    out = redact(quoted)
    assert "cret" not in out and "bob:***@h:5000" in out, out


def test_serialised_forms_of_a_uri_are_masked():
    """As config.yaml (YAML doubles a "'"), a JSON record (escapes a '"'), a Python repr write a URI."""
    uri = "http://bob:se'cr\"et@h:5000"
    for text in (
        yaml.safe_dump({"uri": uri}),
        yaml.safe_dump({"uri": uri}, default_style="'"),
        json.dumps({"uri": uri, "other": 1}),
        repr({"uri": uri, "x": 2}),
        repr([uri, uri]),
    ):
        out = redact(text)
        assert "cr" not in out and out.count("bob:***@h:5000") == text.count("@"), (text, out)


def test_text_without_credentials_is_unchanged():
    for text in (
        "sqlite:////tmp/x/mlflow.db",
        "http://127.0.0.1:5000/#/experiments/1",
        "http://host/path?mail=a@b.org#frag@x",  # an "@" after the authority is not userinfo
        "mail me at a@b.org",
        "file:///home/u@x/y",
        "",
    ):
        assert redact(text) == text


def test_redact_values_masks_every_nested_string():
    obj = {"a": ["http://u:p'w@h", ("https://t@h",)], "b": 3, "c": {"d": "http://u:x@h"}}
    assert redact_values(obj) == {"a": ["http://u:***@h", ("https://***@h",)], "b": 3, "c": {"d": "http://u:***@h"}}
