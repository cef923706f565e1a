"""The JSON Schema of the config file (``loopguard check-config --schema``), as pydantic derives
it from the section dataclasses: each key's type, default and description (the field's
docstring), ranges from :class:`~proxy.config.fields.Bound`, unknown keys not allowed.

Editors that speak the YAML language server validate and complete a config file with it (a
first line ``# yaml-language-server: $schema=loopguard.schema.json``). Checks that span keys
(``window >= duplicate_limit``), regular expressions and templates are ``check-config``'s.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
import typing
from typing import Any

from proxy.config.load import adapter
from proxy.config.root import Config, to_plain

#: The dialect pydantic writes.
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (a string right after ``name: type =
    default``), from its module's source."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for a, b in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = inspect.cleandoc(b.value.value)
    return docs


def _complete(cls: type, defs: dict[str, Any], schema: dict[str, Any]) -> None:
    """Add what pydantic leaves out: each field's description (:func:`field_docs`) and the
    defaults of fields with a ``default_factory`` (``guards.turn_guard.targets: {}``); a
    section's defaults are those of its keys."""
    instance = cls()
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        prop = schema["properties"][f.name]
        if f.name in docs:
            prop["description"] = docs[f.name]
        sub = hints[f.name]
        if dataclasses.is_dataclass(sub):
            _complete(sub, defs, defs[sub.__name__])
        else:
            prop.setdefault("default", to_plain(getattr(instance, f.name)))


def json_schema() -> dict[str, Any]:
    """The config file's JSON Schema (draft 2020-12) as a plain dict."""
    schema = adapter(Config).json_schema()
    _complete(Config, schema["$defs"], schema)
    return {"$schema": DIALECT, **schema, "title": "loopguard configuration"}


def schema_text() -> str:
    """:func:`json_schema` as the text ``check-config --schema`` prints (indented, one newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
