"""``loopguard replay``: captured traffic and fixture conversations through the guards.

What it reads (:func:`load`): capture files (``capture.path``, JSON lines, :mod:`proxy.edge.capture`;
rotated backups ``path.N`` included, oldest first), and fixture files (one JSON object with
``messages``: the format of ``tests/fixtures/loops`` and of the recorded runs kept outside the
repository, ``shared/fixtures/realtraj``; see their READMEs), or directories of them (``*.json``
fixtures, ``*.jsonl`` and ``*.jsonl.N`` captures).

How (:func:`replay`): each conversation is a list of :class:`Exchange` — a request (the history
the agent sent) and the upstream's answer. A capture line is one exchange as it happened; a
fixture is replayed one assistant message at a time (the history before assistant message *i*
is the request, message *i* the answer), then one last request after its last message with no
answer. Every request goes through :func:`proxy.request.rewrite.decide_request` with the guards
of ``--config``, the conversation's memory (:class:`proxy.request.memory.Memory`, at the
capture's time; fixtures at one time), and every answer through the response side's
:func:`proxy.response.decide.deciders` and :func:`proxy.response.decide.decide_json`: the
proxy's own decision code, nothing re-implemented. Observe mode in ``--config`` is honoured
(actions are marked ``observe``).

What it reports: every fresh action at its call (:class:`Act`): calls are numbered from 1 in
conversation order over every call of every assistant message (the answers' calls included). A
request-side withhold is at the call whose result it withholds; a reminder at the last call of
the step it follows (the last call whose result precedes it; 0 before any call); a stop at the
first call of the answer it replaces (the next call number for a text-only answer); a runaway
cut at the first call it drops; a degenerate-text cut at the answer's first call. Then the
totals per rule and kind.

Loading fixtures is here, not in the tests, so that the test harnesses (``tests/helpers/corpus.py``,
``tests/helpers/realtraj.py``) and ``loopguard replay`` read them the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.config import Config
from proxy.core.actions import Action, Cut, Fold, Remind, Stop, Withhold
from proxy.core.effects import progress_rules
from proxy.core.transcript import Transcript
from proxy.dialects import anthropic_messages, openai_chat, openai_responses
from proxy.edge.runtime import collapse_for
from proxy.guards import Context, build_guards
from proxy.guards.stop_note import stop_note_for
from proxy.request.memory import Memory
from proxy.request.rewrite import decide_request
from proxy.response.decide import decide_json, deciders, observed_actions

#: The request dialect of each captured ``dialect`` (Anthropic Messages: without ``system``,
#: which the capture does not keep).
DIALECTS: dict[str, Any] = {
    "chat": openai_chat,
    "responses": openai_responses,
    "messages": anthropic_messages,
}
#: The time every fixture request is decided at (ms since the epoch; fixtures carry none).
FIXTURE_TIME_MS = 1_700_000_000_000


# --- loading ------------------------------------------------------------------------------------------


def id_key(fid: str) -> tuple[str, int, str]:
    """Sort key of a fixture id: ``T2`` before ``T10`` (prefix, then number)."""
    head = fid.rstrip("0123456789")
    tail = fid[len(head) :]
    return head, int(tail) if tail else -1, fid


def load_fixtures(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` fixture of ``directory``, sorted by :func:`id_key` of its ``id``."""
    out = [orjson.loads(p.read_bytes()) for p in sorted(directory.glob("*.json"))]
    return sorted(out, key=lambda f: id_key(str(f.get("id", ""))))


def load_runs(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` recorded run of ``directory`` (``shared/fixtures/realtraj``), sorted by id."""
    runs = [orjson.loads(p.read_bytes()) for p in sorted(directory.glob("*.json"))]
    return sorted(runs, key=lambda r: str(r.get("id", "")))


@dataclass(frozen=True)
class Exchange:
    """One request and the upstream's answer: ``items`` (chat messages, or Responses input
    items for ``dialect == "responses"``), ``answer`` (``{"content", "tool_calls": [{"id",
    "name", "arguments"}]}``, None when there was none), ``time_ms`` (when it was decided), and
    ``key`` (the live conversation key, which the memory of narration timing is kept under)."""

    items: list[Any]
    answer: dict[str, Any] | None
    time_ms: int
    dialect: str = "chat"
    #: the conversation key it was decided under live (``""``: the conversation's id)
    key: str = ""


@dataclass
class Conversation:
    """A conversation to replay: ``id`` (the capture's conversation key or the fixture's id),
    ``source`` (the file), its exchanges in order, and the fixture's ``kind``/``outcome``."""

    id: str
    source: str
    exchanges: list[Exchange] = field(default_factory=list)
    label: str = ""


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {} if isinstance(tc, dict) else {}
        calls.append({"id": tc.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    fc = message.get("function_call")
    if not calls and isinstance(fc, dict):
        calls.append({"id": None, "name": fc.get("name"), "arguments": fc.get("arguments")})
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {"content": content if isinstance(content, str) else None, "tool_calls": calls}


def fixture_conversation(fixture: dict[str, Any], source: str = "") -> Conversation:
    """A fixture replayed one assistant message at a time, then a last request with no answer."""
    messages = fixture.get("messages") or []
    label = str(fixture.get("kind") or "")
    if fixture.get("outcome"):
        label = f"{label} {fixture['outcome']}".strip()
    conv = Conversation(str(fixture.get("id") or Path(source).stem), source, label=label)
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "assistant":
            conv.exchanges.append(Exchange(list(messages[:i]), _answer(m), FIXTURE_TIME_MS))
    conv.exchanges.append(Exchange(list(messages), None, FIXTURE_TIME_MS))
    return conv


def _capture_files(path: Path) -> list[Path]:
    """``path`` and its rotated backups ``path.N``, oldest (highest N) first."""
    backups = [
        p for p in path.parent.glob(path.name + ".*") if re.fullmatch(r"\.\d+", p.name[len(path.name) :])
    ]
    backups.sort(key=lambda p: -int(p.name.rsplit(".", 1)[1]))
    return [*backups, path] if path.exists() else backups


def _continues(conv: Conversation, items: list[Any]) -> bool:
    last = conv.exchanges[-1].items
    return len(last) <= len(items) and items[: len(last)] == last


def capture_conversations(files: Iterable[Path], skipped: dict[str, int] | None = None) -> list[Conversation]:
    """The conversations of capture files, in order of first appearance. A line continues the
    conversation whose last request its history extends (the previous messages are a prefix of
    its own: an agent resends its whole history), preferring one whose last request had the same
    conversation key (the key of a first request, before any tool call id, can differ from its
    successors'); else it starts one. A conversation is named by the key of its last request:
    the key the live ``request`` log lines carry from its first tool call on. ``chained`` lines
    and lines without items are skipped; so are lines that are not a JSON object (a last line
    cut short by a crash or a full disk, a line of another file), counted per file in
    ``skipped`` (``{path: n}``, files with none left out) when given."""
    convs: list[Conversation] = []
    for path in files:
        with path.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    obj = None
                if not isinstance(obj, dict):
                    if skipped is not None:
                        skipped[str(path)] = skipped.get(str(path), 0) + 1
                    continue
                dialect = str(obj.get("dialect") or "chat")
                items = obj.get("input" if dialect == "responses" else "messages")
                if obj.get("chained") or not isinstance(items, list):
                    continue
                key = str(obj.get("conversation") or "")
                candidates = [c for c in convs if _continues(c, items)]
                same = [c for c in candidates if c.id == key]
                pick = (same or candidates)[-1:] if candidates else []
                if pick:
                    conv = pick[0]
                else:
                    conv = Conversation(key, str(path), label="capture")
                    convs.append(conv)
                try:
                    time_ms = int(obj.get("time_ms") or 0)
                except (TypeError, ValueError):
                    time_ms = 0
                conv.id = key or conv.id
                conv.exchanges.append(Exchange(items, obj.get("answer"), time_ms, dialect, key))
    return convs


def load(paths: Sequence[str | Path], skipped: dict[str, int] | None = None) -> list[Conversation]:
    """The conversations of ``paths`` (files or directories; see the module docstring), in the
    order given; a directory's fixtures sorted by id, then its captures. ``skipped``: the
    capture lines that could not be read, per file (:func:`capture_conversations`)."""
    out: list[Conversation] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in load_fixtures(p):
                out.append(fixture_conversation(f, str(p)))
            bases = sorted({c for c in p.iterdir() if re.search(r"\.jsonl$", c.name)})
            bases += sorted(
                {
                    c.with_name(c.name.rsplit(".", 1)[0])
                    for c in p.iterdir()
                    if re.search(r"\.jsonl\.\d+$", c.name)
                }
                - set(bases)
            )
            for base in bases:
                out.extend(capture_conversations(_capture_files(base), skipped))
        elif p.suffix == ".json":
            out.append(fixture_conversation(orjson.loads(p.read_bytes()), str(p)))
        else:
            out.extend(capture_conversations(_capture_files(p), skipped))
    return out


# --- replaying ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Act:
    """One action at its call: ``call`` (1-based, :mod:`module docstring <proxy.cli.replay>`),
    ``rule``, ``kind``, ``side`` (``request`` or ``response``), ``exchange`` (0-based index of
    the request), ``mode`` (``enforce`` or ``observe``), ``reason`` (withhold, stop, cut),
    ``count`` and ``limit``: the action's evidence as the log line has it (two reminders of one
    rule at one call, a step whose parallel calls passed two thresholds, differ there)."""

    call: int
    rule: str
    kind: str
    side: str
    exchange: int
    mode: str = "enforce"
    reason: str = ""
    count: int = 0
    limit: int | None = None

    @property
    def evidence(self) -> str:
        """``count/limit``, or ``count`` when the action has no limit."""
        return str(self.count) if self.limit is None else f"{self.count}/{self.limit}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "call": self.call,
            "rule": self.rule,
            "kind": self.kind,
            "side": self.side,
            "exchange": self.exchange,
            "mode": self.mode,
            "reason": self.reason,
            "count": self.count,
            "limit": self.limit,
        }


@dataclass
class Result:
    """A conversation's replay: every fresh action, by call (and in decision order at one call:
    request side, then response side), the number of calls, and the internal errors (a guard that raised:
    the proxy would have failed open there; the exchange's actions are then missing)."""

    conversation: Conversation
    acts: list[Act] = field(default_factory=list)
    calls: int = 0
    errors: int = 0


def _request_call(a: Action, t: Transcript) -> int:
    if isinstance(a, Withhold):
        for c in t.calls:
            if c.result is not None and c.result.position == a.position:
                return c.seq + 1
    if isinstance(a, Remind):
        before = [c.seq for c in t.calls if c.result is not None and c.result.position <= a.after]
        return max(before) + 1 if before else 0
    if isinstance(a, Fold):  # the run's last call
        return t.steps[a.steps[1]].calls[0] + 1
    return len(t.calls)


def _response_call(a: Action, first: int) -> int:
    if isinstance(a, Cut) and a.rule == "runaway":
        return first + a.count
    return first


def _completion(answer: dict[str, Any]) -> bytes:
    calls = [
        {
            "id": c.get("id"),
            "type": "function",
            "function": {"name": c.get("name"), "arguments": c.get("arguments")},
        }
        for c in answer.get("tool_calls") or []
    ]
    message: dict[str, Any] = {"role": "assistant", "content": answer.get("content")}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
    return orjson.dumps({"object": "chat.completion", "choices": [choice]})


def _act(a: Action, call: int, side: str, exchange: int) -> Act:
    reason = a.reason if isinstance(a, Withhold | Stop | Cut) else ""
    mode = "observe" if a.observed else "enforce"
    return Act(call, a.rule, a.kind, side, exchange, mode, reason, a.count, a.limit)


def replay(conv: Conversation, cfg: Config) -> Result:
    """Replay one conversation with ``cfg`` (fresh guards state: a new proxy process)."""
    guards = build_guards(
        cfg.guards,
        *progress_rules(cfg.progress),
        stop_note_for(cfg),
        cfg.recovery.reminders,
    )
    memory = Memory(guards)
    observed = cfg.observed_rules()
    collapse = collapse_for(cfg)
    # the live key of each request (it may have come from a header; the first request's
    # fingerprint differs from its successors'), so the memory is kept as it was live
    names = cfg.conversation_key.headers
    result = Result(conv)
    for i, ex in enumerate(conv.exchanges):
        key = ex.key or conv.id
        headers = {names[0]: key} if names and key else {}
        field_name = "input" if ex.dialect == "responses" else "messages"
        raw = orjson.dumps({"model": "replay", field_name: ex.items})
        dialect = DIALECTS.get(ex.dialect)
        if dialect is None:
            continue
        try:
            decision = decide_request(
                raw,
                headers,
                guards,
                cfg.conversation_key.headers,
                now_ms=ex.time_ms,
                state_for=memory.state_for(ex.time_ms),
                dialect=dialect,  # type: ignore[arg-type]
                observed=observed,
                collapse=collapse,
            )
            memory.commit(decision, ex.time_ms)
        except Exception:  # the proxy fails open here: the request would go unchanged
            result.errors += 1
            continue
        t = decision.transcript
        if t is None:
            continue
        result.calls = max(result.calls, len(t.calls))
        result.acts += [_act(a, _request_call(a, t), "request", i) for a in decision.actions if a.fresh]
        if ex.answer is None or ex.dialect != "chat":
            continue
        first = len(t.calls) + 1
        result.calls = max(result.calls, len(t.calls) + len(ex.answer.get("tool_calls") or []))
        try:
            ctx = Context(conversation=decision.conversation, now_ms=ex.time_ms)
            d = deciders(t, decision.actions, guards, ctx, cfg, decision.checkpoint)
            body = _completion(ex.answer)
            actions: list[Action] = decide_json(body, d.judge, d.cfg)[1] if d.enforcing else []
            if d.observing:
                actions += observed_actions(actions, decide_json(body, d.shadow_judge, d.shadow_cfg)[1])
        except Exception:
            result.errors += 1
            continue
        result.acts += [_act(a, _response_call(a, first), "response", i) for a in actions if a.fresh]
    result.acts.sort(key=lambda a: (a.call, a.exchange))  # stable: decision order within a call
    return result


def replay_all(convs: Sequence[Conversation], cfg: Config, progress: bool = False) -> list[Result]:
    """Every conversation replayed; ``progress``: a tqdm bar on stderr, one step per exchange."""
    if not progress:
        return [replay(c, cfg) for c in convs]
    from tqdm import tqdm

    out = []
    with tqdm(total=sum(len(c.exchanges) for c in convs), unit="req", file=sys.stderr, leave=False) as bar:
        for c in convs:
            out.append(replay(c, cfg))
            bar.update(len(c.exchanges))
    return out


# --- output ------------------------------------------------------------------------------------------


def totals(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    """Actions per rule and kind over ``results`` (rules sorted, kinds sorted)."""
    counts: Counter[tuple[str, str]] = Counter((a.rule, a.kind) for r in results for a in r.acts)
    out: dict[str, dict[str, int]] = {}
    for (rule, kind), n in sorted(counts.items()):
        out.setdefault(rule, {})[kind] = n
    return out


def _columns(rows: list[tuple[str, ...]], indent: str = "") -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def table(results: Sequence[Result]) -> str:
    """Per conversation a heading (id, label, calls, source) and its actions (call, rule, kind,
    reason, count/limit, side, mode), then the totals per rule."""
    lines: list[str] = []
    for r in results:
        c = r.conversation
        label = f" ({c.label})" if c.label else ""
        errors = f", {r.errors} internal errors" if r.errors else ""
        lines.append(f"{c.id}{label}: {r.calls} calls, {len(r.acts)} actions{errors}")
        if r.acts:
            rows = [("call", "rule", "kind", "reason", "count", "side", "mode")]
            rows += [
                (str(a.call), a.rule, a.kind, a.reason or "-", a.evidence, a.side, a.mode) for a in r.acts
            ]
            lines += _columns(rows, "  ")
        lines.append("")
    tot = totals(results)
    kinds = ["remind", "withhold", "stop", "cut"]
    rows = [("rule", *kinds, "total")]
    for rule, per in tot.items():
        rows.append((rule, *(str(per.get(k, 0)) for k in kinds), str(sum(per.values()))))
    all_kinds = [sum(per.get(k, 0) for per in tot.values()) for k in kinds]
    rows.append(("total", *map(str, all_kinds), str(sum(all_kinds))))
    n = len(results)
    lines.append(f"totals over {n} conversation{'s' if n != 1 else ''}:")
    lines += _columns(rows, "  ")
    return "\n".join(lines) + "\n"


def as_json(results: Sequence[Result]) -> bytes:
    """``{"conversations": [{"id", "label", "source", "calls", "errors", "actions": [...]}],
    "totals": {rule: {kind: n}}}`` (indented, keys in this order)."""
    doc = {
        "conversations": [
            {
                "id": r.conversation.id,
                "label": r.conversation.label,
                "source": r.conversation.source,
                "calls": r.calls,
                "errors": r.errors,
                "actions": [a.as_dict() for a in r.acts],
            }
            for r in results
        ],
        "totals": totals(results),
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def main(args: argparse.Namespace, cfg: Config) -> int:
    """``loopguard replay``: 0 when something was replayed, 1 when the paths held nothing. A
    capture line that cannot be read is skipped; each file with such lines gets one line on
    stderr saying how many."""
    missing = [p for p in args.paths if not Path(p).exists() and not _capture_files(Path(p))]
    if missing:
        print(f"loopguard: replay: no such file or directory: {missing[0]}", file=sys.stderr)
        return 2
    skipped: dict[str, int] = {}
    convs = load(args.paths, skipped)
    for path, n in skipped.items():
        lines = "line" if n == 1 else "lines"
        print(
            f"loopguard: replay: {path}: skipped {n} unreadable {lines} (not a JSON object)", file=sys.stderr
        )
    if not convs:
        print("loopguard: replay: no conversations found", file=sys.stderr)
        return 1
    progress = not args.no_progress and sys.stderr.isatty()
    results = replay_all(convs, cfg, progress)
    if args.format == "json":
        sys.stdout.buffer.write(as_json(results))
    else:
        sys.stdout.write(table(results))
    sys.stdout.flush()
    return 0
