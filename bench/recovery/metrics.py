"""Per-episode and per-arm figures, computed from the raw episode records (pure).

An episode record (written by :mod:`bench.recovery.runner`) has ``steps`` (the agent's, see
:class:`bench.recovery.agent.Step`), ``upstream`` (one entry per request the model server got:
``sha`` of the body, ``extends`` = its messages start with the previous request's, token
counts), ``fallback_requests``, ``actions`` (per agent request, loopguard's fresh actions from
its log), ``solved`` and ``max_steps``. Tokens are model tokens (``usage``).
"""

from __future__ import annotations

from typing import Any

from bench.recovery.loops import broken, find_loop, step_key


def _keys(ep: dict[str, Any]) -> list[str]:
    """The episode's step keys."""
    return [step_key(s["calls"]) for s in ep["steps"]]


def _results(ep: dict[str, Any]) -> list[str]:
    """The episode's step results, joined per step."""
    return ["\n".join(s["results"]) for s in ep["steps"]]


def first_action(ep: dict[str, Any]) -> int | None:
    """Index of the first agent request on which loopguard acted, or None."""
    return next((i for i, acts in enumerate(ep.get("actions") or []) if acts), None)


def quoted_key(ep: dict[str, Any], at: int) -> str:
    """The call the first intervention is about: the latest step before ``at`` whose call has
    the action's tool name (the previous step's when none does or the action names no tool)."""
    keys = _keys(ep)
    tool = (ep["actions"][at][0] or {}).get("tool")
    for k in range(at - 1, -1, -1):
        if tool and any(c[0] == tool for c in ep["steps"][k]["calls"]):
            return keys[k]
    return keys[at - 1] if at > 0 else ""


def episode_figures(ep: dict[str, Any], direct: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one episode; ``direct``: the direct arm's episode with the same seed (for
    the pairing figures), or None.

    Returns ``looped``, ``looped_to_cap`` (looped, and the loop lasted to the step cap),
    ``loop_steps`` and ``loop_tokens`` (steps and prompt+completion tokens from the loop's start
    to its end), ``acted`` (loopguard acted), ``first_action`` (agent request index), ``rules``
    (``rule/kind`` of the first action's actions), ``stopped`` (some action was a stop),
    ``broken``, ``solved``, ``steps``, ``tokens``, ``agent_requests``, ``upstream_requests``
    (main and fallback server), ``extra_upstream``, ``prefix_breaks`` (requests whose messages
    do not extend the previous request's), ``seconds`` (the episode's wall time), ``recovery``
    (the changes of loopguard's ``GET /loop-guard`` "recovery" counters over the episode),
    ``identical_until`` (upstream requests byte-identical to the direct arm's, counted from the
    first), ``paired`` (identical before the first intervention's request, or up to the shorter
    episode's end when there was none), ``primed``/``unprimed``
    (the intervention's step: this arm repeated the quoted call and the direct arm did not / the
    reverse; None when not comparable), ``primed_tool`` (likewise by tool name only: arguments
    drift)."""
    keys, results, steps = _keys(ep), _results(ep), ep["steps"]
    loop = find_loop(keys)
    at = first_action(ep)
    tokens = [s["prompt_tokens"] + s["completion_tokens"] for s in steps]
    ups = ep["upstream"]
    out: dict[str, Any] = {
        "looped": loop is not None,
        "looped_to_cap": loop is not None and loop.end == len(keys) == ep["max_steps"],
        "loop_steps": loop.steps if loop else 0,
        "loop_tokens": sum(tokens[loop.start : loop.end]) if loop else 0,
        "acted": at is not None,
        "first_action": at,
        "rules": sorted({f"{a.get('rule')}/{a.get('kind')}" for a in ep["actions"][at]})
        if at is not None
        else [],
        "stopped": any(a.get("kind") == "stop" for acts in ep.get("actions") or [] for a in acts),
        "broken": broken(keys, results, at) if at is not None else False,
        "solved": ep["solved"],
        "steps": len(steps),
        "tokens": sum(tokens),
        "agent_requests": len(steps),
        "upstream_requests": len(ups) + ep.get("fallback_requests", 0),
        "prefix_breaks": sum(1 for u in ups[1:] if not u["extends"]),
        "seconds": ep.get("wall_s", 0.0),
        "recovery": dict(ep.get("recovery") or {}),
    }
    out["extra_upstream"] = out["upstream_requests"] - out["agent_requests"]
    out["identical_until"] = out["paired"] = out["primed"] = out["unprimed"] = out["primed_tool"] = None
    if direct is not None and direct is not ep:
        mine, theirs = [u["sha"] for u in ups], [u["sha"] for u in direct["upstream"]]
        same = 0
        while same < min(len(mine), len(theirs)) and mine[same] == theirs[same]:
            same += 1
        out["identical_until"] = same
        # The first intervention's request differs (it was rewritten) or not (a response-side
        # action): the requests before it must be the same.
        out["paired"] = same >= (at if at is not None else min(len(mine), len(theirs)))
        dkeys = _keys(direct)
        if at is not None and out["paired"] and at < len(keys) and at < len(dkeys):
            q = quoted_key(ep, at)
            out["primed"] = keys[at] == q and dkeys[at] != q
            out["unprimed"] = keys[at] != q and dkeys[at] == q
            tool, mine_tool, direct_tool = (
                q.split(" ", 1)[0],
                keys[at].split(" ", 1)[0],
                dkeys[at].split(" ", 1)[0],
            )
            out["primed_tool"] = bool(tool) and mine_tool == tool and direct_tool != tool
    return out


def arm_summary(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's row: counts over its episodes, means of ``loop_steps``/``loop_tokens`` over the
    looped episodes and of ``steps`` over all (0 when there are none), sums of the rest (the
    ``recovery`` counters key by key)."""
    n = len(figures)
    looped = [f for f in figures if f["looped"]]

    def count(key: str) -> int:
        return sum(1 for f in figures if f[key])

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return round(sum(f[key] for f in rows) / len(rows), 1) if rows else 0.0

    recovery: dict[str, int] = {}
    for f in figures:
        for k, v in f["recovery"].items():
            recovery[k] = recovery.get(k, 0) + v
    return {
        "episodes": n,
        "looped": len(looped),
        "looped_to_cap": count("looped_to_cap"),
        "acted": count("acted"),
        "broken": count("broken"),
        "stopped": count("stopped"),
        "solved": count("solved"),
        "loop_steps": mean(looped, "loop_steps"),
        "loop_tokens": mean(looped, "loop_tokens"),
        "steps": mean(figures, "steps"),
        "tokens": sum(f["tokens"] for f in figures),
        "primed": count("primed"),
        "unprimed": count("unprimed"),
        "primed_tool": count("primed_tool"),
        "compared": sum(1 for f in figures if f["primed"] is not None),
        "paired": sum(1 for f in figures if f["paired"]),
        "extra_upstream": sum(f["extra_upstream"] for f in figures),
        "prefix_breaks": sum(f["prefix_breaks"] for f in figures),
        "seconds": round(sum(f["seconds"] for f in figures)),
        "recovery": recovery,
    }
