"""Running the arms: the servers, the relays, loopguard per arm, the episodes, the raw records.

Episode ``i`` of every arm has the same task (``TASKS[i % len(TASKS)]``), seed (``seed + i``) and
mode (odd episodes streamed, even ones JSON), so each arm's episode ``i`` pairs with the direct
arm's. Episodes run one after another (the model server answers one request at a time).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from bench.recovery.agent import run_episode
from bench.recovery.arms import ARMS, FALLBACK_SAMPLING, resolve, uses_fallback
from bench.recovery.chat_format import FORMAT_NAME
from bench.recovery.llama import MODEL_ALIAS, find_or_fetch_gguf, llama_python, llama_server
from bench.recovery.loopguard import Loopguard
from bench.recovery.relay import Exchange, Relay
from bench.recovery.tasks import TASKS, make_repo, solved

#: The model server's context window, in tokens (SmolLM2 is trained for 8,192).
N_CTX = 8192


def _norm(messages: list[dict[str, Any]]) -> list[Any]:
    """Messages reduced to what the model is shown (role, text, calls, call id), for the prefix check."""
    return [
        (
            m.get("role"),
            m.get("content") or "",
            [(c["function"]["name"], c["function"].get("arguments")) for c in m.get("tool_calls") or []],
            m.get("tool_call_id"),
        )
        for m in messages
    ]


def upstream_record(exchanges: list[Exchange]) -> list[dict[str, Any]]:
    """One entry per upstream request: ``sha`` (of the body bytes), ``seed`` (the body's),
    ``extends`` (its messages start with the previous request's), ``messages`` (count), ``calls``,
    token counts."""
    out, prev = [], None
    for ex in exchanges:
        cur = _norm(ex.messages)
        out.append(
            {
                "sha": hashlib.sha256(ex.body).hexdigest()[:16],
                "seed": ex.seed,
                "extends": prev is None or cur[: len(prev)] == prev,
                "messages": len(cur),
                "calls": ex.calls,
                "prompt_tokens": ex.prompt_tokens,
                "completion_tokens": ex.completion_tokens,
            }
        )
        prev = cur
    return out


def _counters(lg: Loopguard | None) -> dict[str, int]:
    """Loopguard's ``recovery`` counters now (empty when absent or for the direct arm)."""
    status = lg.status() if lg is not None else None
    rec = (status or {}).get("recovery") or {}
    return {k: v for k, v in rec.items() if isinstance(v, int)}


async def run_arm(
    arm: str,
    overrides: dict[str, Any] | None,
    relay: Relay,
    fallback: Relay | None,
    *,
    episodes: int,
    seed: int,
    max_steps: int,
    workdir: Path,
    progress: Callable[[str], None],
    keep_repos: bool = False,
) -> list[dict[str, Any]]:
    """Run ``episodes`` episodes of one arm; the raw records (see :mod:`bench.recovery.metrics`).
    The episodes' repositories are removed unless ``keep_repos``."""
    lg = None
    if overrides is not None:
        cfg = resolve(overrides, fallback.url if fallback else "")
        lg = Loopguard(relay.url, cfg, Path(tempfile.mkdtemp(prefix=f"lg-{arm}-", dir=workdir)))
        lg.start()
    client = AsyncOpenAI(base_url=lg.url if lg else relay.url, api_key="none", max_retries=0, timeout=600)
    records = []
    try:
        for i in range(episodes):
            task = TASKS[i % len(TASKS)]
            repo = make_repo(task, workdir)
            n0, f0, c0 = len(relay.exchanges), len(fallback.exchanges) if fallback else 0, _counters(lg)
            t0 = time.monotonic()
            stream = i % 2 == 1
            steps = await run_episode(
                client, MODEL_ALIAS, repo, task.prompt, seed + i, stream=stream, max_steps=max_steps
            )
            wall = time.monotonic() - t0
            lines = await lg.request_lines(len(steps)) if lg else []
            c1 = _counters(lg)
            rec = {
                "arm": arm,
                "episode": i,
                "task": task.name,
                "seed": seed + i,
                "stream": stream,
                "max_steps": max_steps,
                "steps": steps,
                "upstream": upstream_record(relay.exchanges[n0:]),
                "fallback_requests": (len(fallback.exchanges) - f0) if fallback else 0,
                "actions": [ln.get("actions") or [] for ln in lines],
                "log_lines": len(lines),
                "recovery": {k: v - c0.get(k, 0) for k, v in c1.items()},
                "solved": solved(task, repo),
                "repo": str(repo),
                "files": sorted(p.name for p in repo.iterdir() if p.is_file()),
                "wall_s": round(wall, 2),
            }
            records.append(rec)
            if not keep_repos:
                shutil.rmtree(repo, ignore_errors=True)
            acted = next((k for k, a in enumerate(rec["actions"]) if a), None)
            progress(
                f"{arm} {i + 1}/{episodes} {task.name} {'stream' if stream else 'json'}: "
                f"{len(steps)} steps, first action at {acted}, solved={rec['solved']}, {wall:.0f} s"
            )
    finally:
        await client.close()
        if lg is not None:
            lg.stop()
    return records


@contextlib.contextmanager
def servers(
    need_fallback: bool, workdir: Path, threads: int | None = None
) -> Iterator[tuple[str, str | None]]:
    """The llama server (and, if ``need_fallback``, a second one with :data:`FALLBACK_SAMPLING`):
    their base URLs; logs in ``workdir``; ``threads`` CPU threads each (None: up to 4)."""
    gguf = find_or_fetch_gguf()
    python = llama_python()
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(
            llama_server(
                gguf,
                python,
                n_ctx=N_CTX,
                n_threads=threads,
                chat_format=FORMAT_NAME,
                log_path=workdir / "llama.log",
            )
        )
        second = None
        if need_fallback:
            second = stack.enter_context(
                llama_server(
                    gguf,
                    python,
                    n_ctx=N_CTX,
                    n_threads=threads,
                    chat_format=FORMAT_NAME,
                    sampling=FALLBACK_SAMPLING,
                    log_path=workdir / "llama-fallback.log",
                )
            )
        yield main, second


async def run_all(
    arms: list[str],
    *,
    episodes: int,
    seed: int,
    max_steps: int,
    workdir: Path,
    keep_repos: bool = False,
    threads: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run ``arms`` (names in :data:`ARMS`; ``direct`` first when chosen) in ``workdir``; the raw
    records per arm (repositories kept in ``workdir`` if ``keep_repos``; ``threads``: the model
    servers' CPU threads)."""

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    need_fallback = any(uses_fallback(ARMS[a]) for a in arms)
    out: dict[str, list[dict[str, Any]]] = {}
    with servers(need_fallback, workdir, threads) as (main_url, second_url):
        relay = Relay(main_url)
        await relay.start()
        fallback = Relay(second_url) if second_url else None
        if fallback:
            await fallback.start()
        try:
            for arm in sorted(arms, key=lambda a: a != "direct"):
                t0 = time.monotonic()
                out[arm] = await run_arm(
                    arm,
                    ARMS[arm],
                    relay,
                    fallback if uses_fallback(ARMS[arm]) else None,
                    episodes=episodes,
                    seed=seed,
                    max_steps=max_steps,
                    workdir=workdir,
                    progress=progress,
                    keep_repos=keep_repos,
                )
                progress(f"{arm}: {time.monotonic() - t0:.0f} s")
        finally:
            await relay.stop()
            if fallback:
                await fallback.stop()
    return out
