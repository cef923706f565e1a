"""The JSON Schema of the config file (``loopguard check-config --schema``), as pydantic derives
it from the section dataclasses: each key's type, default and description (the field's
docstring), ranges from :class:`~proxy.config.fields.Bound`, unknown keys not allowed.

Editors that speak the YAML language server validate and complete a config file with it (a
first line ``# yaml-language-server: $schema=loopguard.schema.json``). Checks that span keys
(``window >= duplicate_limit``), regular expressions and templates are ``check-config``'s.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from proxy.config.load import adapter
from proxy.config.root import Config, to_plain

#: The dialect pydantic writes.
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _defaults(cls: type, defs: dict[str, Any], schema: dict[str, Any]) -> None:
    """Fill in the defaults pydantic leaves out (fields with a ``default_factory``, such as
    ``guards.turn_guard.targets: {}``); a section's defaults are those of its keys."""
    instance = cls()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = hints[f.name]
        if dataclasses.is_dataclass(sub):
            _defaults(sub, defs, defs[sub.__name__])
        else:
            schema["properties"][f.name].setdefault("default", to_plain(getattr(instance, f.name)))


def json_schema() -> dict[str, Any]:
    """The config file's JSON Schema (draft 2020-12) as a plain dict."""
    schema = adapter(Config).json_schema()
    _defaults(Config, schema["$defs"], schema)
    return {"$schema": DIALECT, **schema, "title": "loopguard configuration"}


def schema_text() -> str:
    """:func:`json_schema` as the text ``check-config --schema`` prints (indented, one newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
