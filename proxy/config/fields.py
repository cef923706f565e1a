"""The value types of config keys, as pydantic reads them (DESIGN §8).

Scalars are strict: YAML's ``"3"`` is not an integer, ``yes`` written as a string is not a
boolean, ``true`` is not a number; an integer is a valid number. Lists are read as tuples (the
config is immutable). :class:`Bound` declares a numeric key's range once: :func:`bound_errors`
checks it after the types, so a section's cross-key checks still see the value as written, and
the JSON Schema shows it (``minimum``, ``maximum``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Strict
from pydantic.json_schema import WithJsonSchema

from proxy.errors import ConfigError

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
#: A reminder rule's thresholds (repeat_reminder, same_target): the schema says what
#: :func:`proxy.config.checks.thresholds` checks (not empty, integers >= 2, none twice), so an
#: editor flags ``[1, 3]`` as ``check-config`` does; validation itself stays the check's.
Thresholds = Annotated[
    tuple[Int, ...],
    WithJsonSchema(
        {"type": "array", "items": {"type": "integer", "minimum": 2}, "minItems": 1, "uniqueItems": True}
    ),
]

#: ``mode`` of a guard, of ``stop``, of ``response`` and of the whole file: ``enforce`` applies
#: its actions, ``observe`` decides, logs and counts them but changes no byte.
Mode = Literal["enforce", "observe"]

#: Every section: unknown keys are errors. (Each field's docstring is its description in the JSON
#: Schema, read by :mod:`proxy.config.schema` only: pydantic's ``use_attribute_docstrings`` would
#: parse the sources at every start, about 100 ms.)
SECTION = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Bound:
    """The values a numeric key may take: ``>= ge``, ``> gt``, ``<= le``; with ``off``, 0 too
    (0 turns the feature off). ``note`` follows the message in parentheses (``0 = no cap``);
    ``message`` replaces the derived one. Used as ``Annotated[int, Bound(ge=1)]``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    off: bool = False
    note: str = ""
    message: str = ""

    def allows(self, value: float) -> bool:
        if self.off and value == 0:
            return True
        return not (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (isinstance(value, float) and math.isnan(value))
        )

    def describe(self, integer: bool, nullable: bool) -> str:
        """The error message: ``must be an integer >= 1``, ``must be > 0 or null (no limit)``,
        ``must be 0 (off) or an integer >= 2``, ``must be between 0 and 65535``."""
        if self.message:
            return self.message
        if self.ge is not None and self.le is not None:
            return f"must be between {_num(self.ge)} and {_num(self.le)}"
        parts = []
        if self.ge is not None:
            parts.append(f">= {_num(self.ge)}")
        if self.gt is not None:
            parts.append(f"> {_num(self.gt)}")
        if self.le is not None:
            parts.append(f"<= {_num(self.le)}")
        text = " and ".join(parts)
        if integer:
            text = f"an integer {text}"
        text = f"must be {'0 (off) or ' if self.off else ''}{text}"
        if nullable:
            text += " or null"
        return f"{text} ({self.note})" if self.note else text

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = dict(handler(core_schema))
        target = schema
        if "anyOf" in schema:  # nullable: the range is the number branch's
            target = next(s for s in schema["anyOf"] if s.get("type") != "null")
        if self.off:
            low = {k: v for k, v in (("minimum", self.ge), ("exclusiveMinimum", self.gt)) if v is not None}
            target["anyOf"] = [{"const": 0}, low]
        else:
            for key, value in (("minimum", self.ge), ("exclusiveMinimum", self.gt)):
                if value is not None:
                    target[key] = value
        if self.le is not None:
            target["maximum"] = self.le
        return schema


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def bounds(cls: type) -> dict[str, tuple[Bound, bool, bool]]:
    """The :class:`Bound` of each bounded field of dataclass ``cls``: name → (bound, the field
    is an integer, it may be null)."""
    out: dict[str, tuple[Bound, bool, bool]] = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        nullable = False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            nullable, hint = True, args[0]
        if typing.get_origin(hint) is Annotated:
            base, *meta = typing.get_args(hint)
            for m in meta:
                if isinstance(m, Bound):
                    out[name] = (m, base is int, nullable)
    return out


def bound_errors(obj: Any, path: str) -> Iterator[ConfigError]:
    """A :class:`ConfigError` for each bounded field of ``obj`` whose value is out of range."""
    for name, (bound, integer, nullable) in _bounds_of(type(obj)).items():
        value = getattr(obj, name)
        if value is not None and not bound.allows(value):
            yield ConfigError(f"{path}.{name}" if path else name, bound.describe(integer, nullable))


_BOUNDS: dict[type, dict[str, tuple[Bound, bool, bool]]] = {}


def _bounds_of(cls: type) -> dict[str, tuple[Bound, bool, bool]]:
    if cls not in _BOUNDS:
        _BOUNDS[cls] = bounds(cls)
    return _BOUNDS[cls]


def field_order(cls: type) -> dict[str, int]:
    """Each field's place in dataclass ``cls`` (errors of a section are listed in this order)."""
    return {f.name: i for i, f in enumerate(dataclasses.fields(cls))}
