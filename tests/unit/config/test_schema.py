"""``loopguard check-config --schema``: the config file's JSON Schema, as pydantic derives it from
the section dataclasses. It is valid JSON Schema (draft 2020-12); every key of the shipped file
is in it with its type, default and description; the shipped file and the profiles validate;
a bad file fails on the key it names; the committed ``config/loopguard.schema.json`` (which
editors read through the shipped file's ``yaml-language-server`` line) is the command's output.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from proxy.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "config" / "loopguard.yaml"
COMMITTED = ROOT / "config" / "loopguard.schema.json"
FILES = [SHIPPED, *sorted((ROOT / "config" / "profiles").glob("*.yaml"))]


@pytest.fixture(scope="module")
def printed() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check-config", "--schema"]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def schema(printed: str) -> dict[str, Any]:
    return json.loads(printed)


#: Keys whose value is a mapping of the user's own keys (a leaf with a mapping default).
FREE_MAPPINGS = {("recovery", "resample", "params")}


def _leaves(data: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(data, dict) and data and path not in FREE_MAPPINGS:
        out: dict[tuple[str, ...], Any] = {}
        for k, v in data.items():
            out.update(_leaves(v, (*path, k)))
        return out
    return {path: data}


def _property(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    prop: dict[str, Any] = {}
    for name in path:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        prop = node["properties"][name]
        node = prop
    return prop


def test_the_schema_is_valid_json_schema(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_committed_schema_is_the_commands_output(printed: str) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == printed, "regenerate: loopguard check-config --schema"
    assert SHIPPED.read_text(encoding="utf-8").startswith(
        "# yaml-language-server: $schema=loopguard.schema.json\n"
    )


def test_every_key_of_the_shipped_file_has_its_type_default_and_description(schema: dict[str, Any]) -> None:
    leaves = _leaves(yaml.safe_load(SHIPPED.read_text(encoding="utf-8")))
    assert len(leaves) > 100
    for path, value in leaves.items():
        prop = _property(schema, path)
        key = ".".join(path)
        assert prop.get("description"), key
        assert "type" in prop or "anyOf" in prop or "enum" in prop, key
        assert prop["default"] == value, key


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_shipped_file_and_the_profiles_validate(schema: dict[str, Any], path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text(encoding="utf-8")), schema)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"guards": {"turn_guard": {"max_same_target": 1}}}, ["guards", "turn_guard", "max_same_target"]),
        ({"listen": {"port": 70000}}, ["listen", "port"]),
        ({"upstream": {"read_timeout_s": "slow"}}, ["upstream", "read_timeout_s"]),
        (
            {"guards": {"repeat_reminder": {"inject_as": "system"}}},
            ["guards", "repeat_reminder", "inject_as"],
        ),
        ({"mode": "off"}, ["mode"]),
        # what checks.thresholds rejects, the schema says too
        (
            {"guards": {"repeat_reminder": {"thresholds": [1, 3]}}},
            ["guards", "repeat_reminder", "thresholds", 0],
        ),
        ({"guards": {"same_target": {"thresholds": [3, 3]}}}, ["guards", "same_target", "thresholds"]),
        ({"guards": {"repeat_reminder": {"thresholds": []}}}, ["guards", "repeat_reminder", "thresholds"]),
    ],
)
def test_a_bad_file_fails_on_the_key_it_names(schema: dict[str, Any], data: Any, path: list[str]) -> None:
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert [list(e.absolute_path) for e in errors] == [path]


def test_an_unknown_key_fails_in_its_section(schema: dict[str, Any]) -> None:
    (error,) = jsonschema.Draft202012Validator(schema).iter_errors({"guards": {"cycles": {"rounds": 3}}})
    assert (list(error.absolute_path), error.validator) == (["guards", "cycles"], "additionalProperties")
    assert "'rounds'" in error.message


@pytest.mark.parametrize("argv", [["check-config"], ["check-config", "x.yaml", "--schema"]])
def test_check_config_takes_a_file_or_schema_alone(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
