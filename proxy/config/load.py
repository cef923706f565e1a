"""Reading a config file into :class:`~proxy.config.Config` (DESIGN §8).

pydantic reads the types (strict scalars, lists as tuples, unknown keys rejected) of the
dataclasses; then each section's ranges (:class:`~proxy.config.fields.Bound`) and ``check``
read the values. Every error is a :class:`ConfigError` naming the dotted key
(``guards.repeat_reminder.thresholds[1]``), in the words of :func:`_message`. The errors of a
file come in file order, section by section; within a section its type errors first (in file
order), then its value errors (in the order of the section's fields). A key with a wrong type
takes its default, so the rest of its section is still checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from proxy.config.checks import shown
from proxy.config.fields import bound_errors, field_order
from proxy.config.root import Config
from proxy.errors import ConfigError

#: A field path inside the data: the keys (and list indices) down to one field of a section.
Loc = tuple[Any, ...]

#: The most nodes a config document may stand for once its aliases are expanded (each alias
#: counted as the whole node it names), and the most aliases it may use. The shipped
#: ``config/loopguard.yaml`` is about 420 nodes and uses none; a YAML "billion laughs" document
#: of 300 bytes stands for 10^8 nodes, which building (the duplicate-key walk, then pydantic over
#: the shared lists) took 70 s and 1.2 GB to expand before rejecting it.
MAX_NODES = 100_000
MAX_ALIASES = 1_000


@cache
def adapter(cls: type) -> TypeAdapter[Any]:
    """The pydantic validator of dataclass ``cls``, built once, at the first load (about 60 ms
    for :class:`Config`)."""
    return TypeAdapter(cls)


@cache
def _sections(cls: type) -> dict[str, type | None]:
    """Each field of ``cls``: its section class when it is one, else None."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else None
        for f in dataclasses.fields(cls)
    }


def _field_of(cls: type, loc: Loc) -> Loc:
    """The leading part of pydantic's ``loc`` that names one field (or unknown key) of a section."""
    sections = _sections(cls)
    for i, part in enumerate(loc):
        sub = sections.get(part) if isinstance(part, str) else None
        if sub is None or i == len(loc) - 1:
            return loc[: i + 1]
        sections = _sections(sub)
    return loc


def _nearest(cls: type, loc: Loc) -> str:
    """For an unknown key at ``loc``: `` (did you mean 'port'?)`` naming the closest known key of
    its section (:func:`difflib.get_close_matches`, its default cutoff 0.6), else ``""``."""
    section: type | None = cls
    for part in loc[:-1]:
        if section is None or not isinstance(part, str):
            return ""
        section = _sections(section).get(part)
    name = loc[-1] if loc else None
    if section is None or not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(_sections(section)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _key(path: str, loc: Loc, unknown: bool) -> str:
    """The dotted key of pydantic's ``loc`` under ``path``: ``a.b[2].c``; a bad mapping key is
    named by its mapping (``guards.turn_guard.targets``)."""
    parts = list(loc)
    if parts and parts[-1] == "[key]":
        parts = parts[:-2]
    key = path
    for i, part in enumerate(parts):
        if isinstance(part, int) and not (unknown and i == len(parts) - 1):
            key += f"[{part}]"
        else:
            key = f"{key}.{part}" if key else str(part)
    return key


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "float_type": "a number",
    "string_type": "a string",
}


def _message(error: Any, key: str) -> str:
    """pydantic's error in the config's words: ``unknown key``, ``must be an integer, got '3'``,
    ``must be a list, got str``, ``must be one of 'user', 'tool_suffix', got 'system'``."""
    kind, value = error["type"], error.get("input")
    if kind in ("unexpected_keyword_argument", "invalid_key", "extra_forbidden"):
        return "unknown key"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, got {shown(key, value)}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list, got {type(value).__name__}"
    if kind in ("dict_type", "dataclass_type", "dataclass_exact_type", "mapping_type"):
        return f"must be a mapping, got {type(value).__name__}"
    if kind == "literal_error":
        choices = ", ".join(error.get("ctx", {}).get("expected", "").split(" or "))
        return f"must be one of {choices}, got {shown(key, value)}"
    text = str(error.get("msg", kind))
    return text[:1].lower() + text[1:]


def _normalized(cls: type, data: dict[Any, Any], drop: set[Loc], here: Loc = ()) -> dict[Any, Any]:
    """``data`` without the fields in ``drop`` (they take their defaults), an empty section
    (``listen:`` with nothing under it) read as ``{}``."""
    sections = _sections(cls)
    out: dict[Any, Any] = {}
    for k, v in data.items():
        loc = (*here, k)
        if loc in drop:
            continue
        sub = sections.get(k) if isinstance(k, str) else None
        if sub is not None and v is None:
            v = {}
        if sub is not None and isinstance(v, dict):
            v = _normalized(sub, v, drop, loc)
        out[k] = v
    return out


def _value_errors(obj: Any, path: str) -> list[ConfigError]:
    """The range and ``check`` errors of one section, in the order of its fields."""
    found = [*bound_errors(obj, path)]
    check = getattr(obj, "check", None)
    if check is not None:
        found.extend(check(path))
    order = field_order(type(obj))
    start = len(path) + 1 if path else 0

    def place(e: ConfigError) -> int:
        return order.get(re.split(r"[.\[]", e.key[start:], maxsplit=1)[0], len(order))

    return sorted(found, key=place)


def _ordered(
    cls: type, data: dict[Any, Any], obj: Any, path: str, typed: dict[Loc, list[ConfigError]], here: Loc
) -> Iterator[ConfigError]:
    sections = _sections(cls)
    for k, v in data.items():
        loc = (*here, k)
        if loc in typed:
            yield from typed[loc]
        elif isinstance(k, str) and sections.get(k) is not None and isinstance(v, dict | None):
            key = f"{path}.{k}" if path else k
            yield from _ordered(sections[k], v or {}, getattr(obj, k), key, typed, loc)
    yield from _value_errors(obj, path)


def build(cls: type, data: Any, path: str = "", errors: list[ConfigError] | None = None) -> Any:
    """Build dataclass ``cls`` from a mapping (None = all defaults), validating every key.

    Raises :class:`ConfigError` naming ``path.key`` for unknown keys, wrong types, and whatever
    a section's ranges or ``check(path)`` reject (the first error, in the order described in
    this module's docstring). With ``errors`` (a list), nothing is raised: every error is
    appended and the config built with each key of a wrong type at its default.
    """
    found: list[ConfigError] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        found.append(ConfigError(path or "<root>", f"must be a mapping, got {type(data).__name__}"))
        data = {}
    typed: dict[Loc, list[ConfigError]] = {}
    clean = _normalized(cls, data, set())
    try:
        obj = adapter(cls).validate_python(clean)
    except ValidationError as e:
        for error in e.errors():
            loc = tuple(error["loc"])
            unknown = error["type"] in ("unexpected_keyword_argument", "invalid_key")
            key = _key(path, loc, unknown)
            message = _message(error, key)
            if message == "unknown key":
                message += _nearest(cls, loc)
            typed.setdefault(_field_of(cls, loc), []).append(ConfigError(key, message))
        obj = adapter(cls).validate_python(_normalized(cls, data, set(typed)))
    found.extend(_ordered(cls, data, obj, path, typed, ()))
    if found and errors is None:
        raise found[0]
    if errors is not None:
        errors.extend(found)
    return obj


def config_errors(path: str | Path) -> tuple[Config | None, list[ConfigError]]:
    """Every error of the config file at ``path`` (``check-config``): the config (None when the
    file cannot be read or is not YAML) and the errors, in file order, empty when it is valid."""
    try:
        data = read(path)
    except ConfigError as e:
        return None, [e]
    errors: list[ConfigError] = []
    cfg = build(Config, data, "", errors)
    return (None if errors else cfg), errors


def _duplicate_keys(node: yaml.Node, path: str = "") -> Iterator[ConfigError]:
    """A :class:`ConfigError` for each key that appears twice in one mapping of ``node`` (YAML
    itself lets the last one win silently: a second ``admin_token:`` further down would replace
    the first without a word), naming its dotted path and both lines."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            key = f"{path}.{name}" if path else str(name)
            line = key_node.start_mark.line + 1
            if name is not None and name in seen:
                yield ConfigError(key, f"appears twice (lines {seen[name]} and {line}); keep one")
            elif name is not None:
                seen[name] = line
            yield from _duplicate_keys(value_node, key)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, f"{path}[{i}]")


class _BudgetLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts the aliases it composes (composing is linear in the
    file: an alias is the node it names, shared, not a copy)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
        return super().compose_node(parent, index)


def _expanded_size(n: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``n`` stands for with every alias expanded (a shared node counted once
    per place it appears), computed over the composed graph without expanding it: linear in the
    file, ``sizes`` the memo by node id. Stops counting a collection past :data:`MAX_NODES`."""
    known = sizes.get(id(n))
    if known is not None:
        return known
    total = 1
    if isinstance(n, yaml.SequenceNode):
        children = n.value
    elif isinstance(n, yaml.MappingNode):
        children = [part for pair in n.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, sizes)
        if total > MAX_NODES:
            break
    sizes[id(n)] = total
    return total


def _budget(loader: _BudgetLoader, node: yaml.Node, path: str | Path) -> None:
    """Raise :class:`ConfigError` (``<file>``) when the composed document uses more than
    :data:`MAX_ALIASES` aliases or stands for more than :data:`MAX_NODES` nodes once they are
    expanded (an alias bomb), before anything is built from it."""
    if loader.aliases > MAX_ALIASES:
        raise ConfigError(
            "<file>",
            f"{path} uses {loader.aliases} YAML aliases (at most {MAX_ALIASES}); refused unread",
        )
    if _expanded_size(node, {}) > MAX_NODES:
        raise ConfigError(
            "<file>",
            f"{path} expands to more than {MAX_NODES} YAML nodes through its aliases "
            f"(an alias bomb?); refused unread",
        )


def read(path: str | Path) -> Any:
    """The YAML document of the file at ``path``. Raises :class:`ConfigError`: ``<file>`` when
    it cannot be read, is not YAML, or holds no document at all (empty, or comments only: a file
    truncated or emptied by mistake must not quietly mean "all defaults", which would drop
    ``admin_token``; ``{}`` says that on purpose), or uses more aliases or stands for more
    nodes than its budget (:data:`MAX_ALIASES`, :data:`MAX_NODES`: checked on the composed
    document, before it is walked or built); the key's path when a key appears twice in one
    mapping."""
    try:
        with Path(path).open(encoding="utf-8") as f:
            loader = _BudgetLoader(f)  # a stream, so YAML errors name the file
            try:
                node = loader.get_single_node()
                if node is not None:
                    _budget(loader, node, path)
                    for error in _duplicate_keys(node):
                        raise error
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
    except OSError as e:
        raise ConfigError("<file>", f"cannot read {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError("<file>", f"{path} is not valid YAML: {e}") from e
    if data is None:
        raise ConfigError("<file>", f"{path} holds no settings (empty); write {{}} for all defaults")
    return data


def load_config(path: str | Path | None) -> Config:
    """Load and validate a YAML config file; ``None`` gives the defaults.

    Raises :class:`ConfigError` (key ``<file>`` when the file cannot be read or is not YAML).
    """
    if path is None:
        return Config()
    return build(Config, read(path))
