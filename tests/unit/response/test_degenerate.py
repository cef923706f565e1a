"""Degenerate text detection (proxy.response.degenerate) and its false-positive rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import DegenerateTextConfig
from proxy.response.degenerate import RepetitionDetector, periodic_tail

CFG = DegenerateTextConfig()


def detect(text: str, piece: int = 5, cfg: DegenerateTextConfig = CFG) -> tuple[int, int] | None:
    """Feed ``text`` in pieces; (characters fed when detected, repeats) or None."""
    det = RepetitionDetector(cfg)
    for i in range(0, len(text), piece):
        rep = det.feed(text[i : i + piece])
        if rep:
            return i + piece, rep.repeats
    rep = det.check()
    return (len(text), rep.repeats) if rep else None


SENTENCE = "I will check the configuration file again. "  # 43 characters

LEGIT = (
    "# Fixing the build\n\nThe failure comes from the storage layer: the migration runs before the "
    "connection pool is ready. Here is what I changed and why.\n\n"
    "| file | change | status |\n|------|--------|--------|\n"
    + "| src/db.py | retry | ok |\n" * 30
    + "\n```python\n"
    + "    assert pool.ready()\n" * 40
    + "def wait():\n    pass\n```\n\n"
    + "    indented_code_line()\n" * 20
    + "\n~~~\n"
    + "x = 1\n" * 50
    + "~~~\n\n"
    + "".join(f"{i}. Step {i}: run the migration for shard {i} and check its log.\n" for i in range(1, 60))
    + "\n"
    + "=" * 60
    + "\n\nThat is all: the tests pass now, and the pool waits for the database.\n"
)


@pytest.mark.parametrize(
    ("text", "repeats"),
    [
        pytest.param("Intro. " + SENTENCE * 10, 10, id="sentence_10_times"),
        pytest.param(SENTENCE * 30, 30, id="sentence_30_times"),
        pytest.param("ok\n" + "\n" * 250, 251, id="endless_newlines"),
        pytest.param("ha" * 150, 150, id="ha_150_times"),
        pytest.param("the " * 80, 80, id="one_word_line_without_newline"),
        pytest.param("x" * 50 + ("0123456789" * 5 + "\n") * 12, 12, id="a_50_char_line_12_times"),
    ],
)
def test_degenerate_text_is_detected(text: str, repeats: int) -> None:
    found = detect(text)
    assert found is not None
    assert found[1] >= 10
    rep = periodic_tail(text, 10, 200, 500)
    assert rep is not None and rep.repeats == repeats


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(SENTENCE * 4, id="sentence_4_times_under_200_chars"),
        pytest.param("Intro. " + "A short line.\n" * 9, id="nine_copies"),
        pytest.param("=" * 60, id="a_rule"),
        pytest.param("| a | b |\n" * 100, id="table_rows"),
        pytest.param("```\n" + "print('x')\n" * 100 + "```\n", id="fenced_code"),
        pytest.param("~~~\n" + "x\n" * 300 + "~~~\n", id="tilde_fence"),
        pytest.param("text\n" + "    pass\n" * 100, id="indented_code"),
        pytest.param("\t" + "ab" * 300, id="tab_indented_long_line"),
        pytest.param("  | cell | cell |" * 40, id="streaming_table_row_without_newline"),
        pytest.param("".join(f"- item {i}: done\n" for i in range(200)), id="numbered_items_differ"),
        pytest.param(LEGIT, id="long_legitimate_answer"),
    ],
)
def test_not_degenerate(text: str) -> None:
    assert detect(text) is None
    assert detect(text, piece=1) is None


def test_detected_soon_after_the_rule_holds() -> None:
    text = "Some real answer first.\n" + SENTENCE * 40
    at, _ = detect(text, piece=3)  # type: ignore[misc]
    holds_at = len("Some real answer first.\n") + 10 * len(SENTENCE)
    assert holds_at <= at <= holds_at + 16 + 3


def test_repetition_after_a_code_block_is_detected() -> None:
    text = "```\ncode\n```\n" + SENTENCE * 12
    assert detect(text) is not None


@pytest.mark.parametrize(
    ("cfg", "text", "found"),
    [
        (DegenerateTextConfig(min_repeats=20), SENTENCE * 15, False),
        (DegenerateTextConfig(min_repeats=20), SENTENCE * 25, True),
        (DegenerateTextConfig(min_chars=1000), SENTENCE * 15, False),
        (DegenerateTextConfig(max_period=20), SENTENCE * 30, False),
    ],
)
def test_configurable(cfg: DegenerateTextConfig, text: str, found: bool) -> None:
    assert (detect(text, cfg=cfg) is not None) is found


def test_memory_is_bounded_on_an_endless_line() -> None:
    det = RepetitionDetector(DegenerateTextConfig(min_repeats=10, max_period=50, min_chars=200))
    for i in range(20_000):
        det.feed(f"w{i} ")  # never periodic
    assert len(det._line) <= det._keep + 32  # trimmed at each check (every 16 characters)
    assert len(det._tail) <= 2 * det._keep


def brute_force(text: str, min_repeats: int, min_chars: int, max_period: int) -> tuple[int, int] | None:
    """The rule read literally: every period from 1 up, every character compared."""
    n = len(text)
    for p in range(1, max_period + 1):
        need = max(min_repeats * p, min_chars)
        if need > n:
            continue
        if all(text[i] == text[i - p] for i in range(n - need + p, n)):
            start = n - need
            while start > 0 and text[start - 1] == text[start - 1 + p]:
                start -= 1
            return p, (n - start) // p
    return None


@given(
    st.text(alphabet="ab \n", max_size=60),
    st.text(alphabet="abc .", min_size=1, max_size=12),
    st.integers(min_value=0, max_value=40),
    st.text(alphabet="ab", max_size=3),
    st.integers(min_value=2, max_value=12),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=1, max_value=30),
)
def test_periodic_tail_matches_the_rule_read_literally(
    prefix: str, span: str, copies: int, suffix: str, min_repeats: int, min_chars: int, max_period: int
) -> None:
    text = prefix + span * copies + suffix
    rep = periodic_tail(text, min_repeats, min_chars, max_period)
    assert (None if rep is None else (rep.period, rep.repeats)) == brute_force(
        text, min_repeats, min_chars, max_period
    )
