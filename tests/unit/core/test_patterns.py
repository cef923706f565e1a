"""Tool-name patterns (DESIGN §6): whole-name, case-sensitive, ``*`` the only wildcard."""

from __future__ import annotations

import pytest

from proxy.core.patterns import NamePatterns


@pytest.mark.parametrize(
    ("patterns", "name", "expected"),
    [
        # `*` wildcard
        pytest.param(["read_*"], "read_file", True, id="star_suffix_matches"),
        pytest.param(["read_*"], "read_", True, id="star_matches_empty_run"),
        pytest.param(["read_*"], "xread_file", False, id="star_suffix_anchored_at_start"),
        pytest.param(["*_file"], "read_file", True, id="star_prefix_matches"),
        pytest.param(["*_file"], "read_file_x", False, id="star_prefix_anchored_at_end"),
        pytest.param(["r*_*e"], "read_file", True, id="two_stars_in_one_pattern"),
        pytest.param(["*"], "anything", True, id="lone_star_matches_any_name"),
        pytest.param(["*"], "", True, id="lone_star_matches_empty_name"),
        pytest.param(["a*", "*z"], "buzzy", False, id="wildcard_alternatives_each_anchored_no_match"),
        pytest.param(["a*", "*z"], "quiz", True, id="wildcard_alternatives_second_matches"),
        # whole-name match
        pytest.param(["read"], "read_file", False, id="exact_pattern_not_prefix"),
        pytest.param(["file"], "read_file", False, id="exact_pattern_not_substring"),
        pytest.param(["read_file"], "read_file", True, id="exact_pattern_matches_itself"),
        pytest.param(["bash", "grep"], "grep", True, id="exact_pattern_among_several"),
        pytest.param([""], "", True, id="empty_pattern_matches_empty_name_only"),
        pytest.param([""], "read", False, id="empty_pattern_does_not_match_a_name"),
        # case-sensitive
        pytest.param(["read_file"], "Read_file", False, id="exact_case_sensitive"),
        pytest.param(["Read_*"], "read_file", False, id="wildcard_case_sensitive"),
        # every other character literal
        pytest.param(["read.file"], "read_file", False, id="dot_literal_exact"),
        pytest.param(["read.file"], "read.file", True, id="dot_matches_dot_exact"),
        pytest.param(["re.d*"], "read_file", False, id="dot_literal_in_wildcard_pattern"),
        pytest.param(["re.d*"], "re.d_file", True, id="dot_matches_dot_in_wildcard_pattern"),
        pytest.param(["read?"], "reada", False, id="question_mark_literal_exact"),
        pytest.param(["read?*"], "reada", False, id="question_mark_literal_in_wildcard_pattern"),
        pytest.param(["read?*"], "read?x", True, id="question_mark_matches_itself"),
        pytest.param(["[ab]"], "a", False, id="bracket_class_literal_exact"),
        pytest.param(["[ab]"], "[ab]", True, id="bracket_matches_four_characters"),
        pytest.param(["x[ab]*"], "xa", False, id="bracket_class_literal_in_wildcard_pattern"),
        pytest.param(["x[ab]*"], "x[ab]yz", True, id="bracket_literal_then_star"),
        pytest.param(["a+*"], "aa", False, id="plus_literal"),
        pytest.param(["a|b*"], "b", False, id="pipe_literal_not_alternation"),
        pytest.param(["a|b*"], "a|bc", True, id="pipe_matches_itself"),
        pytest.param(["^a$*"], "^a$", True, id="anchors_literal"),
        pytest.param(["a\\d*"], "a1", False, id="backslash_literal"),
        # empty set
        pytest.param([], "read_file", False, id="empty_set_matches_nothing"),
        pytest.param([], "", False, id="empty_set_matches_not_even_empty_name"),
    ],
)
def test_name_pattern_matches(patterns: list[str], name: str, expected: bool) -> None:
    assert NamePatterns(patterns).matches(name) is expected


@pytest.mark.parametrize(
    ("patterns", "truthy"),
    [
        pytest.param([], False, id="empty_set_is_falsy"),
        pytest.param(["a"], True, id="exact_pattern_set_is_truthy"),
        pytest.param(["*"], True, id="wildcard_set_is_truthy"),
    ],
)
def test_name_patterns_truthiness(patterns: list[str], truthy: bool) -> None:
    assert bool(NamePatterns(patterns)) is truthy


def test_name_patterns_keep_given_patterns_in_order() -> None:
    assert NamePatterns(iter(["b*", "a", "c"])).patterns == ("b*", "a", "c")
