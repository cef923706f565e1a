"""Canonical call key (DESIGN §5): parse_arguments + canonical_arguments."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.canonical import INVALID, canonical_arguments, parse_arguments


def canon(raw: Any, ignore_args: tuple[str, ...] = ()) -> str:
    return canonical_arguments(parse_arguments(raw), raw, ignore_args)


# --- exact canonical strings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param('{"b": 1, "a": 2}', '{"a":2,"b":1}', id="top_level_keys_sorted_compact"),
        pytest.param(
            '{"z": {"y": 1, "x": {"d": 4, "c": 3}}, "a": 0}',
            '{"a":0,"z":{"x":{"c":3,"d":4},"y":1}}',
            id="nested_keys_sorted_recursively",
        ),
        pytest.param('{"n": 1.0}', '{"n":1}', id="integral_float_written_as_integer"),
        pytest.param('{"n": -0.0}', '{"n":0}', id="negative_zero_written_as_zero"),
        pytest.param('{"n": 1e2}', '{"n":100}', id="exponent_integral_float_written_as_integer"),
        pytest.param('{"n": 1.5}', '{"n":1.5}', id="fractional_float_kept"),
        pytest.param('{"n": [1.0, 2.50, -0.0]}', '{"n":[1,2.5,0]}', id="floats_inside_arrays_normalized"),
        pytest.param('{"p": "café/日本.py"}', '{"p":"café/日本.py"}', id="non_ascii_kept_verbatim"),
        pytest.param('{"p": "caf\\u00e9"}', '{"p":"café"}', id="unicode_escape_decoded_to_character"),
        pytest.param('{"a": [3, 1, 2]}', '{"a":[3,1,2]}', id="array_order_kept"),
        pytest.param('[{"b":1,"a":2}, 1]', '[{"a":2,"b":1},1]', id="top_level_array_kept_in_order"),
        pytest.param('"just a string"', '"just a string"', id="top_level_json_string"),
        pytest.param("", "{}", id="empty_string_is_empty_object"),
        pytest.param("   \n", "{}", id="whitespace_only_is_empty_object"),
        pytest.param(None, "{}", id="none_is_empty_object"),
        pytest.param("{}", "{}", id="empty_object_string"),
        pytest.param({"b": 1, "a": 1.0}, '{"a":1,"b":1}', id="object_arguments_canonicalized"),
        pytest.param("{not json", "{not json", id="invalid_json_kept_raw"),
        pytest.param('{"a": 1,}', '{"a": 1,}', id="trailing_comma_invalid_kept_raw_with_spaces"),
    ],
)
def test_canonical_arguments_exact_string(raw: Any, expected: str) -> None:
    assert canon(raw) == expected


# --- equal / different pairs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param('{"a": {"x": 1, "y": 2}}', '{"a": {"y": 2, "x": 1}}', id="nested_key_order_ignored"),
        pytest.param('{"a":1,"b":2}', '{\n  "b" : 2 ,\n  "a" : 1\n}', id="whitespace_ignored"),
        pytest.param('{"n": 1}', '{"n": 1.0}', id="one_equals_one_point_zero"),
        pytest.param('{"n": 0}', '{"n": -0.0}', id="zero_equals_negative_zero"),
        pytest.param('{"n": 100}', '{"n": 1e2}', id="integer_equals_exponent_float"),
        pytest.param("", "{}", id="empty_string_equals_empty_object"),
        pytest.param(None, "{}", id="none_equals_empty_object"),
        pytest.param(None, "", id="none_equals_empty_string"),
        pytest.param({"path": "a.py", "n": 2}, '{"n":2,"path":"a.py"}', id="object_equals_string_form"),
        pytest.param({}, "", id="empty_dict_equals_empty_string"),
        pytest.param("{broken", "{broken", id="same_invalid_json_equal"),
        pytest.param('{"p":"é"}', '{"p":"\\u00e9"}', id="escaped_and_literal_non_ascii_equal"),
        pytest.param(
            '{"a": 1e20, "b": 1}', '{"b": 1, "a": 1e20}', id="integral_float_beyond_64_bits_key_order_ignored"
        ),
        pytest.param(
            '{"a": 100000000000000000000}',
            '{"a":100000000000000000000}',
            id="integer_beyond_64_bits_whitespace_ignored",
        ),
    ],
)
def test_canonical_arguments_equal(left: Any, right: Any) -> None:
    assert canon(left) == canon(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param("{broken", "{broken ", id="different_invalid_strings_differ"),
        pytest.param("{broken", '"{broken"', id="invalid_raw_differs_from_json_string"),
        pytest.param('{"a": [1, 2]}', '{"a": [2, 1]}', id="array_order_matters"),
        pytest.param('{"n": 1}', '{"n": 1.5}', id="different_numbers_differ"),
        pytest.param('{"n": 1}', '{"n": "1"}', id="number_differs_from_string"),
        pytest.param('{"p": "A"}', '{"p": "a"}', id="string_values_case_sensitive"),
        pytest.param("{}", "[]", id="empty_object_differs_from_empty_array"),
        pytest.param('{"a": null}', "{}", id="null_valued_key_differs_from_absent_key"),
    ],
)
def test_canonical_arguments_differ(left: Any, right: Any) -> None:
    assert canon(left) != canon(right)


# --- parse_arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("", {}, id="empty_string"),
        pytest.param(None, {}, id="none"),
        pytest.param('{"a": 1}', {"a": 1}, id="json_object_string"),
        pytest.param({"a": 1}, {"a": 1}, id="object_passed_through"),
        pytest.param("[1, 2]", [1, 2], id="json_array_string"),
    ],
)
def test_parse_arguments_decodes(raw: Any, expected: Any) -> None:
    assert parse_arguments(raw) == expected


@pytest.mark.parametrize("raw", ["{", "not json", '{"a": 1,}', "{'a': 1}", '{"a": NaN}'])
def test_parse_arguments_marks_invalid_json(raw: str) -> None:
    assert parse_arguments(raw) is INVALID


def test_parse_arguments_returns_object_argument_itself() -> None:
    args = {"path": "a.py"}
    assert parse_arguments(args) is args


# --- ignore_args ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "ignore", "expected"),
    [
        pytest.param(
            '{"path": "a.py", "description": "look"}',
            ("description",),
            '{"path":"a.py"}',
            id="top_level_dropped",
        ),
        pytest.param(
            '{"opts": {"description": "keep", "x": 1}, "description": "drop"}',
            ("description",),
            '{"opts":{"description":"keep","x":1}}',
            id="nested_same_name_kept",
        ),
        pytest.param(
            '{"a": 1, "reason": "r", "thought": "t"}',
            ("reason", "thought", "purpose"),
            '{"a":1}',
            id="several_dropped_absent_ones_ignored",
        ),
        pytest.param(
            '[{"description": "x"}]',
            ("description",),
            '[{"description":"x"}]',
            id="top_level_array_untouched",
        ),
        pytest.param("{bad description", ("description",), "{bad description", id="invalid_json_untouched"),
        pytest.param(
            '{"thought": "step 2: compare"}',
            ("thought",),
            '{"thought":"step 2: compare"}',
            id="sole_argument_kept",
        ),
        pytest.param(
            '{"thought": "a", "reason": "b"}',
            ("thought", "reason"),
            '{"reason":"b","thought":"a"}',
            id="nothing_else_left_keeps_all",
        ),
        pytest.param(
            '{"path": "a.py", "description": "look"}',
            (),
            '{"description":"look","path":"a.py"}',
            id="empty_ignore_keeps_everything",
        ),
        pytest.param(
            {"Description": "x", "description": "y"},
            ("description",),
            '{"Description":"x"}',
            id="key_match_case_sensitive",
        ),
    ],
)
def test_ignore_args_drops_top_level_keys_only(raw: Any, ignore: tuple[str, ...], expected: str) -> None:
    assert canon(raw, ignore) == expected


def test_keep_sole_false_drops_even_the_only_argument() -> None:
    """The seed dsh-circuit-breaker dropped ignore_args unconditionally."""
    raw = '{"thought": "step 2"}'
    assert canonical_arguments(parse_arguments(raw), raw, ("thought",), keep_sole=False) == "{}"


def test_ignore_args_does_not_mutate_object_arguments() -> None:
    args = {"path": "a.py", "description": "x"}
    canon(args, ("description",))
    assert args == {"path": "a.py", "description": "x"}


# --- property: key order and whitespace never change the canonical form ---------------------------

# Numbers stay within 64-bit range here; numbers beyond it are pinned by the explicit cases above.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
)
_keys = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(_keys, _json, max_size=6),
    seed=st.integers(0, 2**32 - 1),
    indent=st.sampled_from([None, 0, 2]),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]),
    ensure_ascii=st.booleans(),
)
def test_canonical_invariant_to_key_order_and_whitespace(
    value: dict[str, Any], seed: int, indent: int | None, separators: tuple[str, str], ensure_ascii: bool
) -> None:
    reference = canon(json.dumps(value))
    reordered = json.dumps(
        _shuffled(value, random.Random(seed)), indent=indent, separators=separators, ensure_ascii=ensure_ascii
    )
    assert canon(reordered) == reference
    assert canon(value) == reference
    assert json.loads(reference) == value
