"""Configuration (DESIGN §3, §6.1, §8): defaults, validation naming the key, file loading, CLI."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

import proxy.edge.serve
from proxy.cli.main import effective_config, main
from proxy.config import (
    Config,
    ConversationKeyConfig,
    ListenConfig,
    RepeatReminderConfig,
    UpstreamConfig,
    build,
    load_config,
    to_plain,
)
from proxy.errors import ConfigError

RR = "guards.repeat_reminder"


def rr(data: dict[str, Any]) -> dict[str, Any]:
    """A whole config mapping with ``data`` under guards.repeat_reminder."""
    return {"guards": {"repeat_reminder": data}}


def write(tmp_path: Path, text: str, name: str = "loopguard.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        pytest.param(
            "listen",
            {
                "host": "127.0.0.1",
                "port": 4000,
                "shutdown_grace_s": 30.0,
                "header_timeout_s": 60.0,
                "body_timeout_s": 60.0,
                "max_connections": 1024,
            },
            id="listen",
        ),
        pytest.param(
            "upstream",
            {
                "url": "http://127.0.0.1:8080/v1",
                "connect_timeout_s": 10.0,
                "read_timeout_s": 900.0,
                "max_body_mb": 64,
                "stream_json_requests": False,
            },
            id="upstream",
        ),
        pytest.param(
            "conversation_key",
            {"headers": ["x-session-id", "session_id", "conversation_id"]},
            id="conversation_key",
        ),
        pytest.param("admin_token", None, id="admin_token"),
    ],
)
def test_default_config_sections_match_design(section: str, expected: Any) -> None:
    assert to_plain(Config())[section] == expected


def test_default_repeat_reminder_matches_design() -> None:
    assert to_plain(Config().guards.repeat_reminder) == {
        "mode": "enforce",
        "enabled": True,
        "thresholds": [3, 5, 8],
        "include": [],
        "exclude": [],
        "ignore_args": ["description", "explanation", "reason", "thought", "purpose"],
        "arguments_preview_chars": 500,
        "inject_as": "user",
        "progress_aware": True,
    }


@pytest.mark.parametrize("data", [None, {}], ids=["null_document", "empty_mapping"])
def test_empty_config_is_all_defaults(data: Any) -> None:
    assert build(Config, data) == Config()


def test_load_config_none_gives_defaults() -> None:
    assert load_config(None) == Config()


def test_load_config_empty_mapping_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "{}\n")) == Config()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("# only a comment\n\n", id="comments_only"),
        pytest.param("~\n", id="null_document"),
    ],
)
def test_a_file_without_settings_is_a_config_error(tmp_path: Path, text: str) -> None:
    # an emptied file must not mean "all defaults": that would silently drop admin_token
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == f"<file>: {path} holds no settings (empty); write {{}} for all defaults"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param(
            "admin_token: a\nmode: enforce\nadmin_token: b\n",
            "admin_token: appears twice (lines 1 and 3); keep one",
            id="top_level",
        ),
        pytest.param(
            "guards:\n  circuit_breaker:\n    window: 5\n    window: 6\n",
            "guards.circuit_breaker.window: appears twice (lines 3 and 4); keep one",
            id="nested",
        ),
        pytest.param(
            "progress:\n  masks:\n    - {name: a, name: b}\n",
            "progress.masks[0].name: appears twice (lines 3 and 3); keep one",
            id="in_a_list",
        ),
    ],
)
def test_a_duplicate_key_is_a_config_error_naming_its_path(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    assert str(exc.value) == error


# --- repeat_reminder validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thresholds", "key"),
    [
        pytest.param([], "thresholds", id="empty"),
        pytest.param([1, 3], "thresholds", id="below_two"),
        pytest.param([0], "thresholds", id="zero"),
        pytest.param([-3], "thresholds", id="negative"),
        pytest.param([2.5], "thresholds[0]", id="non_integer_float"),
        pytest.param([3, 3], "thresholds", id="duplicate"),
        pytest.param("3", "thresholds", id="string_not_list"),
        pytest.param(3, "thresholds", id="scalar_not_list"),
        pytest.param([True], "thresholds[0]", id="boolean"),
        pytest.param([3, "5"], "thresholds[1]", id="string_element"),
        pytest.param(None, "thresholds", id="null"),
    ],
)
def test_bad_thresholds_rejected_naming_the_thresholds_key(thresholds: Any, key: str) -> None:
    """A bad element is named with its index (``thresholds[1]``), a bad list by the key itself."""
    with pytest.raises(ConfigError) as exc:
        build(Config, rr({"thresholds": thresholds}))
    assert exc.value.key == f"{RR}.{key}"
    assert str(exc.value).startswith(f"{RR}.{key}: ")


@pytest.mark.parametrize(
    ("thresholds", "expected"),
    [
        pytest.param([4, 2], (2, 4), id="unsorted_sorted_ascending"),
        pytest.param([8, 3, 5], (3, 5, 8), id="three_unsorted"),
        pytest.param([2], (2,), id="single_minimum"),
        pytest.param([3, 5, 8], (3, 5, 8), id="already_sorted"),
    ],
)
def test_valid_thresholds_accepted_sorted(thresholds: list[int], expected: tuple[int, ...]) -> None:
    assert build(Config, rr({"thresholds": thresholds})).guards.repeat_reminder.thresholds == expected


@pytest.mark.parametrize("value", [0, 12.5, -1, True, "500", None], ids=str)
def test_bad_arguments_preview_chars_rejected(value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, rr({"arguments_preview_chars": value}))
    assert exc.value.key == f"{RR}.arguments_preview_chars"


@pytest.mark.parametrize("value", [1, 24, 500], ids=str)
def test_arguments_preview_chars_accepted(value: int) -> None:
    assert (
        build(Config, rr({"arguments_preview_chars": value})).guards.repeat_reminder.arguments_preview_chars
        == value
    )


@pytest.mark.parametrize("value", ["user", "tool_suffix"])
def test_inject_as_accepts_user_and_tool_suffix(value: str) -> None:
    assert build(Config, rr({"inject_as": value})).guards.repeat_reminder.inject_as == value


@pytest.mark.parametrize("value", ["system", "User", "", None, 1], ids=repr)
def test_inject_as_rejects_other_values(value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, rr({"inject_as": value}))
    assert exc.value.key == f"{RR}.inject_as"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("include", "read_*", id="include_string_not_list"),
        pytest.param("exclude", [1], id="exclude_non_string_element"),
        pytest.param("ignore_args", "description", id="ignore_args_string_not_list"),
        pytest.param("enabled", "yes", id="enabled_not_boolean"),
    ],
)
def test_repeat_reminder_wrong_types_rejected(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, rr({key: value}))
    assert exc.value.key.startswith(f"{RR}.{key}")


def test_repeat_reminder_lists_become_tuples() -> None:
    cfg = build(Config, rr({"include": ["pro*"], "exclude": ["todo_write"], "ignore_args": []}))
    assert cfg.guards.repeat_reminder == RepeatReminderConfig(
        include=("pro*",), exclude=("todo_write",), ignore_args=()
    )


# --- unknown keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key"),
    [
        pytest.param({"guard": {}}, "guard", id="top_level"),
        pytest.param({"listen": {"prt": 1}}, "listen.prt", id="listen"),
        pytest.param({"upstream": {"uri": "http://x"}}, "upstream.uri", id="upstream"),
        pytest.param({"guards": {"repeat": {}}}, "guards.repeat", id="guards"),
        pytest.param(rr({"threshold": [3]}), f"{RR}.threshold", id="repeat_reminder"),
        pytest.param({"conversation_key": {"header": []}}, "conversation_key.header", id="conversation_key"),
    ],
)
def test_unknown_key_named_by_dotted_path(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert exc.value.key == key
    assert str(exc.value).startswith(f"{key}: ")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param({"listen": {"prot": 1}}, "listen.prot: unknown key (did you mean 'port'?)", id="listen"),
        pytest.param({"upstrem": {}}, "upstrem: unknown key (did you mean 'upstream'?)", id="top_level"),
        pytest.param(
            rr({"thresholds": [3], "inject_ass": "user"}),
            f"{RR}.inject_ass: unknown key (did you mean 'inject_as'?)",
            id="nested",
        ),
        pytest.param({"guards": {"zzz": {}}}, "guards.zzz: unknown key", id="nothing_close"),
    ],
)
def test_unknown_key_suggests_the_nearest_known_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("data", "key"),
    [
        pytest.param({"listen": [1]}, "listen", id="listen_list"),
        pytest.param({"guards": "on"}, "guards", id="guards_string"),
        pytest.param({"guards": {"repeat_reminder": [3, 5]}}, RR, id="repeat_reminder_list"),
    ],
)
def test_section_that_is_not_a_mapping_named(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert exc.value.key == key


# --- listen / upstream ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["ftp://host/v1", "localhost:8080/v1", "127.0.0.1:8080", "http://", "", "file:///tmp/x"],
)
def test_upstream_url_must_be_http_or_https(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, {"upstream": {"url": url}})
    assert exc.value.key == "upstream.url"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/v1", "https://api.example.com/v1", "http://h"])
def test_upstream_url_http_and_https_accepted(url: str) -> None:
    assert build(Config, {"upstream": {"url": url}}).upstream.url == url


@pytest.mark.parametrize(
    ("data", "key"),
    [
        pytest.param({"listen": {"port": 70000}}, "listen.port", id="port_too_high"),
        pytest.param({"listen": {"port": -1}}, "listen.port", id="port_negative"),
        pytest.param({"listen": {"port": "4000"}}, "listen.port", id="port_string"),
        pytest.param({"upstream": {"connect_timeout_s": 0}}, "upstream.connect_timeout_s", id="timeout_zero"),
        pytest.param({"upstream": {"read_timeout_s": -1}}, "upstream.read_timeout_s", id="read_timeout_neg"),
        pytest.param({"upstream": {"max_body_mb": 0}}, "upstream.max_body_mb", id="max_body_zero"),
        pytest.param({"admin_token": 5}, "admin_token", id="admin_token_not_string"),
    ],
)
def test_listen_and_upstream_values_validated(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert exc.value.key == key


# --- load_config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param("- a\n- b\n", "<root>", id="yaml_list_not_mapping"),
        pytest.param("just a string\n", "<root>", id="yaml_scalar_not_mapping"),
        pytest.param("listen: [\n", "<file>", id="invalid_yaml"),
        pytest.param("a: b: c\n", "<file>", id="invalid_yaml_mapping"),
    ],
)
def test_load_config_bad_file_names_file_or_root(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    assert exc.value.key == key


def test_load_config_missing_file_names_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as exc:
        load_config(missing)
    assert exc.value.key == "<file>"
    assert str(missing) in str(exc.value)


def test_load_config_reads_values_and_keeps_other_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "listen:\n  port: 5001\nguards:\n  repeat_reminder:\n    thresholds: [4, 2]\n")
    cfg = load_config(str(path))
    assert cfg.listen == ListenConfig(host="127.0.0.1", port=5001)
    assert cfg.guards.repeat_reminder.thresholds == (2, 4)
    assert cfg.upstream == UpstreamConfig()
    assert cfg.conversation_key == ConversationKeyConfig()


def test_load_config_unknown_key_in_file_named(tmp_path: Path) -> None:
    path = write(tmp_path, "guards:\n  repeat_reminder:\n    threshold: [3]\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert exc.value.key == f"{RR}.threshold"


# --- check-config CLI -----------------------------------------------------------------------------------


def test_check_config_prints_effective_config_as_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, "guards:\n  repeat_reminder:\n    thresholds: [4, 2]\n    inject_as: tool_suffix\n"
    )
    assert main(["check-config", str(path), "--print"]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert captured.err.startswith(f"loopguard: {path} is valid: every key is known")
    assert printed == to_plain(load_config(path))
    assert printed["guards"]["repeat_reminder"]["thresholds"] == [2, 4]
    assert printed["guards"]["repeat_reminder"]["inject_as"] == "tool_suffix"
    assert printed["listen"] == {
        "host": "127.0.0.1",
        "port": 4000,
        "shutdown_grace_s": 30.0,
        "header_timeout_s": 60.0,
        "body_timeout_s": 60.0,
        "max_connections": 1024,
    }


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "guards:\n  repeat_reminder:\n    thresholds: [1]\n", f"{RR}.thresholds", id="bad_value"
        ),
        pytest.param("listen:\n  prt: 1\n", "listen.prt", id="unknown_key"),
        pytest.param("- 1\n", "<root>", id="not_a_mapping"),
        pytest.param("listen: [\n", "<file>", id="invalid_yaml"),
    ],
)
def test_check_config_bad_file_exits_2_naming_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str
) -> None:
    assert main(["check-config", str(write(tmp_path, text))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"invalid configuration: {key}: " in captured.err


def test_check_config_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "absent.yaml")]) == 2
    assert "<file>" in capsys.readouterr().err


# --- effective_config precedence: flags > env > file > defaults ---------------------------------------------

FILE_YAML = "listen:\n  host: 10.0.0.1\n  port: 5000\nupstream:\n  url: http://file:1/v1\n"


def ns(
    config: str | None = None, upstream: str | None = None, host: str | None = None, port: str | None = None
):
    return argparse.Namespace(config=config, upstream=upstream, host=host, port=port)


@pytest.mark.parametrize(
    ("use_file", "env", "flags", "expected"),
    [
        pytest.param(False, {}, {}, ("127.0.0.1", 4000, "http://127.0.0.1:8080/v1"), id="defaults"),
        pytest.param(True, {}, {}, ("10.0.0.1", 5000, "http://file:1/v1"), id="file_beats_defaults"),
        pytest.param(
            True,
            {"LOOPGUARD_HOST": "0.0.0.0", "LOOPGUARD_PORT": "6000", "LOOPGUARD_UPSTREAM": "http://env:2/v1"},
            {},
            ("0.0.0.0", 6000, "http://env:2/v1"),
            id="env_beats_file",
        ),
        pytest.param(
            True,
            {"LOOPGUARD_HOST": "0.0.0.0", "LOOPGUARD_PORT": "6000", "LOOPGUARD_UPSTREAM": "http://env:2/v1"},
            {"host": "::1", "port": "7000", "upstream": "https://flag:3/v1"},
            ("::1", 7000, "https://flag:3/v1"),
            id="flags_beat_env",
        ),
        pytest.param(
            True,
            {"LOOPGUARD_PORT": "6000"},
            {"host": "::1"},
            ("::1", 6000, "http://file:1/v1"),
            id="mixed_sources_per_key",
        ),
        pytest.param(
            False,
            {"LOOPGUARD_PORT": ""},
            {},
            ("127.0.0.1", 4000, "http://127.0.0.1:8080/v1"),
            id="empty_env_ignored",
        ),
    ],
)
def test_effective_config_precedence(
    tmp_path: Path, use_file: bool, env: dict[str, str], flags: dict[str, str], expected: tuple[str, int, str]
) -> None:
    config = str(write(tmp_path, FILE_YAML)) if use_file else None
    cfg = effective_config(ns(config=config, **flags), env)
    assert (cfg.listen.host, cfg.listen.port, cfg.upstream.url) == expected


def test_effective_config_reads_file_from_loopguard_config_env(tmp_path: Path) -> None:
    path = write(tmp_path, FILE_YAML)
    cfg = effective_config(ns(), {"LOOPGUARD_CONFIG": str(path)})
    assert (cfg.listen.host, cfg.listen.port) == ("10.0.0.1", 5000)


def test_effective_config_flag_file_beats_env_file(tmp_path: Path) -> None:
    env_file = write(tmp_path, "listen:\n  port: 5000\n", "env.yaml")
    flag_file = write(tmp_path, "listen:\n  port: 5555\n", "flag.yaml")
    cfg = effective_config(ns(config=str(flag_file)), {"LOOPGUARD_CONFIG": str(env_file)})
    assert cfg.listen.port == 5555


def test_effective_config_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "guards:\n  repeat_reminder:\n    thresholds: [4, 2]\nadmin_token: s3cret\n")
    cfg = effective_config(ns(config=str(path), port="4100"), {})
    assert cfg.guards.repeat_reminder.thresholds == (2, 4)
    assert cfg.admin_token == "s3cret"
    assert cfg.listen.port == 4100


@pytest.mark.parametrize(
    ("env", "flags", "key"),
    [
        pytest.param({"LOOPGUARD_PORT": "abc"}, {}, "LOOPGUARD_PORT", id="env_port_not_integer"),
        pytest.param({}, {"port": "abc"}, "--port", id="flag_port_not_integer"),
        pytest.param(
            {"LOOPGUARD_PORT": "4000"}, {"port": "x1"}, "--port", id="bad_flag_reported_over_good_env"
        ),
    ],
)
def test_effective_config_bad_port_names_its_source(
    env: dict[str, str], flags: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        effective_config(ns(**flags), env)
    assert exc.value.key == key


def test_serve_with_bad_env_port_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def must_not_serve(cfg: Config) -> None:
        raise AssertionError("serve must not start with an invalid port")

    monkeypatch.setattr(proxy.edge.serve, "serve_forever", must_not_serve)
    monkeypatch.setenv("LOOPGUARD_PORT", "abc")
    monkeypatch.delenv("LOOPGUARD_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "LOOPGUARD_PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "env", "key"),
    [
        pytest.param({}, {"LOOPGUARD_UPSTREAM": "ftp://x"}, "LOOPGUARD_UPSTREAM", id="env_upstream"),
        pytest.param({}, {"LOOPGUARD_PORT": "70000"}, "LOOPGUARD_PORT", id="env_port_range"),
        pytest.param({"port": "70000"}, {}, "--port", id="flag_port_range"),
        pytest.param({"upstream": "localhost:8080"}, {}, "--upstream", id="flag_upstream_no_scheme"),
        pytest.param(
            {"upstream": "nope"}, {"LOOPGUARD_UPSTREAM": "http://ok"}, "--upstream", id="flag_wins_blame"
        ),
    ],
)
def test_bad_override_names_the_flag_or_variable_it_came_from(
    flags: dict[str, str], env: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        effective_config(ns(**flags), env)
    assert exc.value.key == key
