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

try:  # the standard library's own regular expression parser (3.11+: re._parser)
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

#: Keys whose value is a credential: an error about one names its type, never its value.
SECRET_KEYS = frozenset({"admin_token"})
#: Keys whose value is a URL that may carry a credential (user info, a query ``api-key``):
#: shown through :func:`proxy.config.redact.redact_url`.
URL_KEYS = frozenset({"upstream.url", "state.backend", "recovery.fallback.url"})


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


_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)
_CATEGORIES = {
    _sre.CATEGORY_DIGIT: str.isdigit,
    _sre.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    _sre.CATEGORY_SPACE: str.isspace,
    _sre.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    _sre.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    _sre.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}


def _matches_char(op: Any, av: Any, ch: str) -> bool:
    """Whether the one-character item ``(op, av)`` of a parsed expression may match ``ch``, as
    written (the caller tries both cases); True for an item it does not know."""
    if op is _sre.LITERAL:
        return chr(av) == ch
    if op is _sre.NOT_LITERAL:
        return chr(av) != ch
    if op is _sre.ANY:
        return True
    if op is _sre.IN:
        negate = bool(av) and av[0][0] is _sre.NEGATE
        hit = False
        for item_op, item_av in av[1:] if negate else av:
            if item_op is _sre.RANGE:
                hit = item_av[0] <= ord(ch) <= item_av[1]
            elif item_op is _sre.CATEGORY:
                hit = _CATEGORIES.get(item_av, lambda c: True)(ch)
            else:
                hit = _matches_char(item_op, item_av, ch)
            if hit:
                break
        return hit != negate
    return True


def _inner_repeats(items: Any) -> Iterator[Any]:
    """The repeats (of more than one item, a variable count) inside ``items``, through groups
    and alternatives; a possessive repeat or an atomic group never backtracks, so neither is
    looked into."""
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            if high != low and (high is _sre.MAXREPEAT or high > 1):
                yield sub
            yield from _inner_repeats(sub)
        elif op is _sre.SUBPATTERN:
            yield from _inner_repeats(av[-1])
        elif op is _sre.BRANCH:
            for branch in av[1]:
                yield from _inner_repeats(branch)


#: The characters a separator is tried against (:func:`_separator`): Latin and its symbols.
_SAMPLE = tuple(chr(i) for i in range(0x250))
_SINGLE = (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN)


def _separator(op: Any, av: Any, singles: list[Any]) -> bool:
    """Whether the parsed item ``(op, av)``, wherever it is required, must match a character
    that none of the one-character items ``singles`` can (either case of a literal)."""

    def foreign(ch: str) -> bool:
        return not any(_matches_char(o, a, c) for o, a in singles for c in {ch, ch.lower(), ch.upper()})

    if op is _sre.LITERAL:
        return foreign(chr(av))
    if op in _SINGLE:
        return all(foreign(ch) for ch in _SAMPLE if _matches_char(op, av, ch))
    if op in _REPEATS:
        return av[0] >= 1 and any(_separator(o, a, singles) for o, a in av[2])
    if op is _sre.SUBPATTERN:
        return any(_separator(o, a, singles) for o, a in av[-1])
    if op is _sre.BRANCH:
        return all(any(_separator(o, a, singles) for o, a in branch) for branch in av[1])
    return False


def _separated(body: Any, inner: list[Any]) -> bool:
    """Whether one iteration of a repeated ``body`` must contain a character that none of its
    ``inner`` repeats can match (as ``.`` in ``(\\d+\\.)+``): then where one iteration ends is
    certain, and the nested repeat cannot backtrack exponentially."""
    singles = []
    for sub in inner:
        items = list(sub)
        if len(items) != 1 or items[0][0] not in _SINGLE:
            return False  # a repeat of a longer expression: not judged, taken as ambiguous
        singles.append(items[0])
    return any(_separator(op, av, singles) for op, av in body)


def _nested(items: Any) -> bool:
    """Whether parsed ``items`` hold a repeat (more than once) of a body holding a repeat of its
    own, with nothing certain between the iterations (:func:`nested_quantifier`)."""
    for op, av in items:
        if op in _REPEATS:
            _, high, sub = av
            if high is _sre.MAXREPEAT or high > 1:
                inner = list(_inner_repeats(sub))
                if inner and not _separated(sub, inner):
                    return True
            if _nested(sub):
                return True
        elif op is _sre.SUBPATTERN:
            if _nested(av[-1]):
                return True
        elif op is _sre.BRANCH:
            if any(_nested(branch) for branch in av[1]):
                return True
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT) and _nested(av[1]):
            return True
    return False


#: Why :func:`nested_quantifier` rejects a pattern, in an error message.
NESTED_QUANTIFIERS = (
    "has nested quantifiers (a repeated group that repeats something itself, as in (a+)+ or "
    "(\\w+\\s?)*): it backtracks exponentially on text that almost matches; rewrite it so "
    "each repetition must contain a character the inner repeat cannot match, as in (\\d+\\.)+"
)


def nested_quantifier(pattern: str, flags: int = 0) -> bool:
    """Whether ``pattern`` (which must compile) repeats a group that itself repeats something,
    with no character that must separate the iterations: ``(a+)+``, ``(\\w+\\s?)*``,
    ``(?:x*y?){2,}`` (not ``(\\d+\\.)+``: each iteration ends at its ``.``). Such a pattern
    backtracks exponentially on a near-miss (one mask took 54 s on one request). Source: the
    classic catastrophic-backtracking shape (OWASP, "Regular expression Denial of Service");
    overlapping alternatives (``(a|aa)+``) are not detected."""
    return _nested(_sre_parse.parse(pattern, flags))


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
    """Each pattern must compile as a failure pattern (:func:`compile_failure_pattern`) and have
    no nested quantifiers (:func:`nested_quantifier`); the error names ``key[i]``."""
    for i, pattern in enumerate(patterns):
        try:
            compile_failure_pattern(pattern)
        except re.error as e:
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}")
        except ValueError as e:
            yield ConfigError(f"{key}[{i}]", f"is rejected: {e}")
        else:
            if nested_quantifier(pattern, re.MULTILINE):
                yield ConfigError(f"{key}[{i}]", NESTED_QUANTIFIERS)


def regexes(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each pattern must be a non-blank regular expression without nested quantifiers
    (:func:`nested_quantifier`); the error names ``key[i]``."""
    for i, pattern in enumerate(patterns):
        if not pattern.strip():
            yield ConfigError(f"{key}[{i}]", "must not be empty")
            continue
        try:
            re.compile(pattern)
        except re.error as e:
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}")
            continue
        if nested_quantifier(pattern):
            yield ConfigError(f"{key}[{i}]", NESTED_QUANTIFIERS)


def masks(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each mask must be a regular expression that cannot match the empty string and has no
    nested quantifiers (:func:`nested_quantifier`), and together they must combine into one
    expression (:func:`mask_alternation`)."""
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
        elif nested_quantifier(pattern):  # searched in every result of every request
            yield ConfigError(f"{key}[{i}]", NESTED_QUANTIFIERS)
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
