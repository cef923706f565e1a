"""The markdown table of the arms (one row per arm), as written into ``docs/recovery.md``."""

from __future__ import annotations

from typing import Any

#: Columns: (summary key, header). Counts are episodes unless the header says otherwise.
COLUMNS: list[tuple[str, str]] = [
    ("episodes", "episodes"),
    ("looped", "looped"),
    ("looped_to_cap", "looped to the cap"),
    ("acted", "acted on"),
    ("broken", "loops broken"),
    ("stopped", "stopped"),
    ("solved", "solved"),
    ("loop_steps", "steps in the loop (mean)"),
    ("loop_tokens", "tokens in the loop (mean)"),
    ("steps", "steps (mean)"),
    ("primed", "primed"),
    ("unprimed", "unprimed"),
    ("primed_tool", "primed (tool)"),
    ("compared", "pairs compared"),
    ("extra_upstream", "extra upstream requests"),
    ("prefix_breaks", "prefix-cache breaks"),
    ("seconds", "seconds"),
]


def table(summaries: dict[str, dict[str, Any]]) -> str:
    """The arms' summaries (:func:`bench.recovery.metrics.arm_summary`) as a markdown table."""
    head = "| arm | " + " | ".join(h for _, h in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [
        f"| `{arm}` | " + " | ".join(str(s[k]) for k, _ in COLUMNS) + " |" for arm, s in summaries.items()
    ]
    counters = [
        f"- `{arm}`: " + ", ".join(f"{k} {v}" for k, v in sorted(s["recovery"].items()))
        for arm, s in summaries.items()
        if any(s.get("recovery", {}).values())
    ]
    tail = [
        "",
        "loopguard's `recovery` counters (`GET /loop-guard`), summed over the episodes:",
        "",
        *counters,
    ]
    return "\n".join([head, rule, *rows, *(tail if counters else [])]) + "\n"


#: Markers around the generated table in the docs page; the text around them is kept.
BEGIN = "<!-- recovery-table: begin -->"
END = "<!-- recovery-table: end -->"


def splice(page: str, generated: str) -> str:
    """``page`` with the text between :data:`BEGIN` and :data:`END` replaced by ``generated``.

    Raises:
        ValueError: the page has not both markers."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + generated + page[end:]
