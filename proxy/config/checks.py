"""Checks a section runs on its values once their types are right (DESIGN §8): regular
expressions, templates, thresholds, files; and how an error may show a value it rejects.

Each check yields one :class:`ConfigError` per problem, naming the dotted key, so
``check-config`` can list every error of a file.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.config.redact import REDACTED, redact_url
from proxy.errors import ConfigError

#: Keys whose value is a credential: an error about one names its type, never its value.
SECRET_KEYS = frozenset({"admin_token"})
#: Keys whose value is a URL that may carry a credential (user info, a query ``api-key``):
#: shown through :func:`proxy.config.redact.redact_url`.
URL_KEYS = frozenset({"upstream.url", "state.backend"})


def shown(key: str, value: Any) -> str:
    """``value`` as an error message about ``key`` may show it: a credential's type only
    (``a value of type int (not shown)``), a URL redacted (:func:`redact_url` with ``marked``), a
    URL-key value without a host and without ``@`` (``localhost:8080/v1``: no user info) as
    written with key-like query values marked, one with ``@`` not at all, anything else its
    ``repr``."""
    if key in SECRET_KEYS:
        return f"a value of type {type(value).__name__} (not shown)"
    if key in URL_KEYS and isinstance(value, str):
        if urlsplit(value).netloc or re.fullmatch(r"[\w.-]*", value):  # a URL with a host, a word
            return repr(redact_url(value, marked=True))
        if (
            "@" not in value
        ):  # no user info anywhere (``localhost:8080/v1``): shown, key-like query values marked
            return repr(_CREDENTIAL_PARAM.sub(rf"\1{REDACTED}", value))
        return "a value that is not a URL with a host (not shown)"  # where its user info ends is unknown
    return repr(value)


#: A query parameter whose value may be a credential (``api-key=``, ``token=``, ``sig=``…), in a
#: value shown although it is not a URL with a host: its value is marked :data:`REDACTED`.
_CREDENTIAL_PARAM = re.compile(
    r"([?&;][^=&;#]*(?:key|token|secret|pass|pw|auth|sig|credential|session)[^=&;#]*=)[^&;#]*", re.I
)


def compile_failure_pattern(pattern: str) -> re.Pattern[str]:
    """Compile one failure pattern (``guards.turn_guard.failure_patterns``,
    ``guards.repeated_failure.rejection_patterns``) as it is searched: multiline, in a result's
    edges. Raises ``re.error`` when it is not a regular expression and ``ValueError`` when it
    matches an empty result (it would call every result a failure)."""
    compiled = re.compile(pattern, re.MULTILINE)
    if compiled.search("") is not None:
        raise ValueError("it matches an empty result, so every result would be a failure")
    return compiled


def mask_alternation(patterns: Sequence[str]) -> str:
    """The one expression ``progress.masks`` is searched as: each pattern a group, first listed
    first."""
    return "|".join(f"(?:{p})" for p in patterns)


def failure_patterns(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each pattern must compile as a failure pattern (:func:`compile_failure_pattern`); the
    error names ``key[i]``."""
    for i, pattern in enumerate(patterns):
        try:
            compile_failure_pattern(pattern)
        except re.error as e:
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}")
        except ValueError as e:
            yield ConfigError(f"{key}[{i}]", f"is rejected: {e}")


def regexes(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each pattern must be a non-blank regular expression; the error names ``key[i]``."""
    for i, pattern in enumerate(patterns):
        if not pattern.strip():
            yield ConfigError(f"{key}[{i}]", "must not be empty")
            continue
        try:
            re.compile(pattern)
        except re.error as e:
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}")


def masks(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each mask must be a regular expression that cannot match the empty string, and together
    they must combine into one expression (:func:`mask_alternation`)."""
    bad = False
    for i, pattern in enumerate(patterns):
        if not pattern:
            yield ConfigError(f"{key}[{i}]", "must not be empty")
            bad = True
            continue
        try:
            compiled = re.compile(pattern)
            re.compile(mask_alternation([pattern]))  # a global inline flag fails only in a group
        except re.error as e:
            hint = " (inline flags only in scoped form, e.g. (?i:...))" if "flags" in str(e) else ""
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}{hint}")
            bad = True
            continue
        if compiled.match(""):
            yield ConfigError(f"{key}[{i}]", "must not match the empty string")
            bad = True
    if bad or not patterns:  # the combined expression is checked once every mask is valid on its own
        return
    try:
        re.compile(mask_alternation(patterns))
    except re.error as e:  # e.g. a global inline flag that is only valid at the start
        yield ConfigError(key, f"cannot be combined into one expression: {e}")


def names(values: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """No blank entry in a list of names or patterns; the error names ``key[i]``."""
    for i, value in enumerate(values):
        if not value.strip():
            yield ConfigError(f"{key}[{i}]", "must not be empty")


def thresholds(values: tuple[int, ...], key: str) -> Iterator[ConfigError]:
    """A reminder rule's thresholds: not empty, integers >= 2, none twice; the error names ``key``."""
    if not values:
        yield ConfigError(key, "must not be empty")
    elif any(t < 2 for t in values):
        yield ConfigError(key, "every threshold must be an integer >= 2")
    if len(set(values)) != len(values):
        yield ConfigError(key, "thresholds must not repeat")


def at_least_other(value: int, other: int, other_name: str, key: str) -> Iterator[ConfigError]:
    """``value`` (of ``key``) must be >= the section's ``other_name``."""
    if value < other:
        yield ConfigError(key, f"must be >= {other_name} ({other}), got {value}")


def off_or_above(value: int, other: int, other_name: str, key: str) -> Iterator[ConfigError]:
    """``value`` (of ``key``) must be 0 (off) or > the section's ``other_name``."""
    if value and value <= other:
        yield ConfigError(key, f"must be 0 (off) or > {other_name} ({other})")


def template(text: str, allowed_names: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Reject a ``str.format`` template that uses anything but ``{name}`` for ``allowed_names``
    (with an optional conversion or format spec that renders for sample values)."""
    allowed = ", ".join(f"{{{n}}}" for n in allowed_names)
    fmt = string.Formatter()
    fields: list[str] = []
    try:
        for _, name, spec, _ in fmt.parse(text):
            if name is not None:
                fields.append(name)
            if spec:  # nested fields, as in {count:{width}}
                fields.extend(n for _, n, _, _ in fmt.parse(spec) if n is not None)
    except ValueError as e:
        hint = "write {{ and }} for literal braces"
        yield ConfigError(key, f"is not a valid template ({e}); {hint}")
        return
    for f in fields:
        if f not in allowed_names:
            yield ConfigError(key, f"unknown placeholder {{{f}}}; allowed: {allowed}")
            return
    try:
        text.format(**{n: 1 if n in ("count", "limit") else n for n in allowed_names})
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        yield ConfigError(key, f"cannot be rendered: {e}")


def unwritable(file: Path) -> str:
    """Why a file to be appended to (``capture.path``) cannot be written, "" when it can: its
    directory is missing, not a directory or not writable (``os.access``, which also says no on
    a read-only file system), or the file itself is a directory or not writable."""
    parent = file.parent
    if not parent.exists():
        return f"its directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if file.is_dir():
        return f"{str(file)!r} is a directory"
    if file.exists():
        if not os.access(file, os.W_OK):
            return f"{str(file)!r} is not writable"
    elif not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {str(parent)!r} is not writable"
    return ""
