"""Tool-name patterns (DESIGN §6): whole-name match, case-sensitive, ``*`` is the only wildcard.

Every other character is literal: ``read.file`` does not match ``read_file``, ``[ab]`` matches only
the four characters ``[ab]``. A pattern that matches no tool is not an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class NamePatterns:
    """A compiled set of tool-name patterns. ``NamePatterns(["read_*", "bash"]).matches("read_file")``
    is True. An empty set matches nothing."""

    __slots__ = ("_exact", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns: tuple[str, ...] = tuple(patterns)
        self._exact = frozenset(p for p in self.patterns if "*" not in p)
        wild = [p for p in self.patterns if "*" in p]
        self._regex = (
            re.compile("|".join(".*".join(map(re.escape, p.split("*"))) for p in wild)) if wild else None
        )

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, name: str) -> bool:
        if name in self._exact:
            return True
        return self._regex is not None and self._regex.fullmatch(name) is not None
