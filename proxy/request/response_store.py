"""The Responses API's ``previous_response_id`` chains: what loopguard keeps so that a request
carrying only its new items is guarded over the whole conversation (the upstream rebuilds the
rest from its own copy, which the guards cannot see).

A request ``{"previous_response_id": "resp_A", "input": [new items]}`` asks the upstream to
rebuild the history from its own copy of ``resp_A``'s chain. The guards need that history
(DESIGN §1.2: decisions are a pure function of the conversation), so loopguard keeps, per
response id seen in an upstream answer, an :class:`Entry`:

- **The chain as the agent has it**: the entry of the request's own ``previous_response_id``
  (if any), then the request's ``input`` items exactly as the agent sent them (before
  loopguard's edits: re-derived actions are recomputed from the original history, as with a full
  ``input``), then the answer's ``output`` items as the agent received them. When loopguard
  rewrote the answer (a Stop replaced the calls with its stop message), the agent's view is kept:
  it is what the agent would send back in full-input mode, so a chained conversation gets the
  same transcript, and the same decisions at the same positions, as the same conversation sent in
  full. Stored as JSON bytes (one array per request input and per answer), decoded when used.
- **What the upstream holds is the same chain rewritten**: every action loopguard applied was
  applied when it was fresh, to items that were then new. So on a request whose
  ``previous_response_id`` is known, the transcript is the stored chain plus the new items;
  actions at positions inside the stored part (``Entry.count`` items) are already in the
  upstream's copy and are not applied again; actions on the new part are applied with their
  positions shifted to the request's ``input`` list
  (:func:`proxy.dialects.openai_responses.apply_chained`). An action that would only now appear
  inside the stored part cannot be applied (the upstream holds those items already).
- **Where the upstream's copy differs from the agent's** (loopguard rewrote the answer), the
  upstream still has its own answer: calls the agent never received. A server checks that every
  call in a chain has its output ("No tool output found for function call …"), so the next
  request off that response would fail. :func:`repair_items` lists what brings the upstream's
  copy in line: one ``function_call_output`` / ``custom_tool_call_output`` per dropped call
  (:data:`NOT_RUN_TEXT`), then the assistant message(s) loopguard wrote (the stop message,
  without its id). They are prepended to the ``input`` of every request whose
  ``previous_response_id`` is that response (the guards never see them: they are not in the
  agent's history). For an answer loopguard cut mid-stream (runaway, degenerate text) the
  upstream's state is unknown: nothing is prepended.
- **Not kept**: answers to requests with ``store: false`` (the upstream keeps nothing either;
  Codex CLI sends its whole ``input`` that way and needs no store), answers whose ``status`` is
  not ``completed`` or ``incomplete`` (failed, queued, background), answers loopguard could not
  read (compressed with something other than gzip/deflate, not JSON).
- **Unknown ids**: a ``previous_response_id`` that is not held (never seen, evicted, expired, a
  restart, another replica) is forwarded unguarded and counted
  (``unguarded{reason="unknown_previous_response"}``); it is logged once per chain: the answer's
  id joins the *lost* ids, and a request continuing a lost id is counted but not logged again.

- **One credential's chains**: the server keys each entry by :func:`store_key`, a digest of the
  request's credential headers (:data:`CREDENTIAL_HEADERS`), its query string (``?api-key=``,
  ``?key=``) and the response id, never by the id alone: an upstream keeps a tenant's responses
  for that tenant, so a request under another credential that names tenant A's id must not get
  A's history injected into its guarded transcript. To it the id is unknown, as it is to the
  upstream. Neither the credential nor the id is held (an id the agent chooses may be megabytes
  long): the keys and the lost ids are fixed-size digests, the same on every replica.

Bounds (:class:`proxy.config.ResponsesStoreConfig`), the least recently used entry dropped
first: ``max_entries`` (0 keeps nothing); ``max_bytes_mb``, the bytes of the items held (the
entries of one chain share their byte strings, which count once: a chain of 100 responses over
a 1 MB history holds about 1 MB; an entry whose chain alone is larger than the budget is not
kept); ``max_age_s`` since an entry was stored or last used. The lost ids are bounded by
:data:`MAX_LOST` and the same age. Times are seconds from an injected clock (monotonic by
default). Not thread-safe: the server uses it from its event loop only.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.config import ResponsesStoreConfig
from proxy.dialects import jsonbody
from proxy.dialects.openai_responses import Answer

#: ``RequestDecision.unguarded`` for a ``previous_response_id`` loopguard does not hold.
UNKNOWN_PREVIOUS = "unknown_previous_response"
#: The output loopguard gives the upstream for a call it dropped from an answer (see module doc).
NOT_RUN_TEXT = (
    "[loopguard] This call was not run: loopguard removed it from the answer before the agent received it."
)
#: Lost ids remembered (for logging an unknown chain once).
MAX_LOST = 4096
CALL_OUTPUT = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
#: The request headers that can carry a tenant's credential (OpenAI's bearer token, Azure's
#: ``api-key`` and API Management's ``Ocp-Apim-Subscription-Key``, Anthropic's ``x-api-key``,
#: Google's ``x-goog-api-key``, a session cookie), lower-case: with the query they scope a kept
#: response.
CREDENTIAL_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
    "cookie",
)


def store_key(headers: Mapping[str, str], rid: str, query: str = "") -> str:
    """The key of response ``rid`` kept for the credential of a request with ``headers``
    (case-insensitive, as aiohttp's are) and the query string ``query`` (as sent, without the
    ``?``): ``r-`` + the first 32 hex digits of SHA-256 over each :data:`CREDENTIAL_HEADERS`
    value (length-prefixed, empty when absent), the query (length-prefixed) and then ``rid``.
    The whole query counts, not only the parameters known to carry keys (``api-key``, ``key``,
    ``access_token``, …): an upstream may read a key from any parameter, and an agent sends the
    same query on every request of a conversation. The same credential and id give the same key
    on every replica; another credential, in a header or in the query, gives another key."""
    h = hashlib.sha256()
    for name in CREDENTIAL_HEADERS:
        value = (headers.get(name) or "").encode("utf-8", "surrogatepass")
        h.update(len(value).to_bytes(8, "big"))
        h.update(value)
    raw = query.encode("utf-8", "surrogatepass")
    h.update(len(raw).to_bytes(8, "big"))
    h.update(raw)
    h.update(rid.encode("utf-8", "surrogatepass"))
    return f"r-{h.hexdigest()[:32]}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One kept response: ``segments`` (JSON arrays of items, in order) hold the chain as the agent
    has it, ``count`` items in all, ``size`` bytes. ``repair``: a JSON array of the items the
    upstream's copy lacks (see module doc; ``b""`` for none), ``repair_count`` of them."""

    segments: tuple[bytes, ...]
    count: int
    size: int
    repair: bytes = b""
    repair_count: int = 0

    def items(self) -> list[Any]:
        out: list[Any] = []
        for segment in self.segments:
            out.extend(orjson.loads(segment))
        return out


@dataclass(frozen=True, slots=True)
class Chain:
    """What a Responses request tells the store, from the request side
    (:func:`proxy.request.rewrite.decide_request`). ``segments``/``count``/``size``: the chain up to and
    including this request's ``input``, as the agent sent it. ``previous``: its
    ``previous_response_id``. ``keep``: keep the answer (the request is guarded and not
    ``store: false``). ``lost``: the previous id was unknown (the answer's id is lost too)."""

    segments: tuple[bytes, ...] = ()
    count: int = 0
    size: int = 0
    previous: str | None = None
    keep: bool = False
    lost: bool = False

    def history(self) -> bytes:
        """The kept chain (and, when ``keep``, this request's input) as a request body
        ``{"input": [...]}``, for what reads a history from bytes
        (:func:`proxy.response.decide.earlier_stops`)."""
        inner = [seg[1:-1] for seg in self.segments if len(seg) > 2]
        return b'{"input":[' + b",".join(inner) + b"]}"


def chain_of(entry: Entry | None, new_items: Sequence[Any], previous: str | None, keep: bool) -> Chain:
    """The :class:`Chain` of a request: ``entry``'s chain (None: none) plus ``new_items``."""
    base = entry.segments if entry is not None else ()
    count = entry.count if entry is not None else 0
    size = entry.size if entry is not None else 0
    if not keep:
        return Chain(base, count, size, previous, False)
    segment = jsonbody.kept(jsonbody.dumps(list(new_items)))  # stored: its own size
    return Chain((*base, segment), count + len(new_items), size + len(segment), previous, True)


def repair_items(answer: Answer) -> list[dict[str, Any]]:
    """What the upstream's copy of ``answer`` lacks next to the agent's (module doc): an output
    with :data:`NOT_RUN_TEXT` for each call the agent did not receive (the agent's calls are
    always the first ones of the upstream's), then each assistant message the upstream did not
    write, without ``id`` and ``status``."""
    if answer.upstream is None:
        return []
    out: list[dict[str, Any]] = []
    kept = sum(1 for i in answer.output if isinstance(i, dict) and i.get("type") in CALL_OUTPUT)
    calls = [i for i in answer.upstream if isinstance(i, dict) and i.get("type") in CALL_OUTPUT]
    for item in calls[kept:]:
        cid = item.get("call_id")
        if isinstance(cid, str):
            out.append({"type": CALL_OUTPUT[item["type"]], "call_id": cid, "output": NOT_RUN_TEXT})
    for item in answer.output:
        if (
            isinstance(item, dict)
            and item.get("type") == "message"
            and item.get("role") == "assistant"
            and item not in answer.upstream
        ):
            out.append({"type": "message", "role": "assistant", "content": item.get("content")})
    return out


def entry_of(chain: Chain, answer: Answer) -> Entry:
    """The entry for ``answer``, given the request's ``chain``."""
    segment = jsonbody.kept(jsonbody.dumps(list(answer.output)))  # stored: its own size
    repair = repair_items(answer)
    return Entry(
        (*chain.segments, segment),
        chain.count + len(answer.output),
        chain.size + len(segment),
        jsonbody.kept(jsonbody.dumps(repair)) if repair else b"",
        len(repair),
    )


class ResponseStore:
    """The bounded map response id → :class:`Entry` (module doc), plus the lost ids."""

    __slots__ = ("_bytes", "_entries", "_lost", "_segments", "cfg", "clock", "evicted", "kept")

    def __init__(self, cfg: ResponsesStoreConfig | None = None, clock: Callable[[], float] | None = None):
        self.cfg = cfg or ResponsesStoreConfig()
        self.clock: Callable[[], float] = clock or time.monotonic
        self._entries: OrderedDict[str, tuple[Entry, float]] = OrderedDict()
        self._lost: OrderedDict[str, float] = OrderedDict()
        #: id of each segment held → [the segment, how many kept entries hold it]; the entries of
        #: one chain share their segments, which are counted once
        self._segments: dict[int, list[Any]] = {}
        self._bytes = 0
        #: entries stored, and entries dropped by a bound (count, bytes, age) since start
        self.kept = 0
        self.evicted = 0

    @property
    def max_bytes(self) -> int | None:
        mb = self.cfg.max_bytes_mb
        return None if mb is None else int(mb * 1024 * 1024)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes held: every segment of the kept entries, each once."""
        return self._bytes

    def ids(self) -> list[str]:
        """The kept ids, least recently used first."""
        return list(self._entries)

    def _expired(self, used: float, now: float) -> bool:
        age = self.cfg.max_age_s
        return age is not None and now - used > age

    def _hold(self, entry: Entry) -> None:
        for seg in entry.segments:
            held = self._segments.get(id(seg))
            if held is None:
                self._segments[id(seg)] = [seg, 1]
                self._bytes += len(seg)
            else:
                held[1] += 1

    def _drop(self, rid: str) -> None:
        entry, _ = self._entries.pop(rid)
        for seg in entry.segments:
            held = self._segments[id(seg)]
            held[1] -= 1
            if held[1] == 0:
                del self._segments[id(seg)]
                self._bytes -= len(seg)

    def _expire(self, now: float) -> None:
        while self._entries:
            rid, (_, used) = next(iter(self._entries.items()))
            if not self._expired(used, now):
                break
            self._drop(rid)
            self.evicted += 1
        while self._lost:
            rid, used = next(iter(self._lost.items()))
            if not self._expired(used, now):
                break
            del self._lost[rid]

    def get(self, rid: str) -> Entry | None:
        """The entry of ``rid`` (which counts as a use), or None."""
        now = self.clock()
        self._expire(now)
        held = self._entries.get(rid)
        if held is None:
            return None
        self._entries[rid] = (held[0], now)
        self._entries.move_to_end(rid)
        return held[0]

    def peek(self, rid: str) -> Entry | None:
        """The entry of ``rid`` without counting a use (None when not kept)."""
        held = self._entries.get(rid)
        return held[0] if held is not None else None

    def put(self, rid: str, entry: Entry) -> bool:
        """Keep ``entry`` for ``rid`` (replacing one kept for it); then drop entries past a bound,
        least recently used first. Returns False when nothing is kept (``max_entries`` 0, or the
        entry alone is larger than ``max_bytes_mb``)."""
        now = self.clock()
        if rid in self._entries:
            self._drop(rid)
        limit = self.max_bytes
        if self.cfg.max_entries == 0 or (limit is not None and entry.size > limit):
            return False
        self._entries[rid] = (entry, now)
        self._hold(entry)
        self.kept += 1
        self._expire(now)
        while len(self._entries) > self.cfg.max_entries or (limit is not None and self._bytes > limit):
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        return True

    def note_unknown(self, previous: str) -> bool:
        """A request names ``previous``, which is not kept. True when that chain was not already
        known to be lost (log it); either way ``previous`` is lost from now on."""
        now = self.clock()
        self._expire(now)
        first = previous not in self._lost
        self.lose(previous)
        return first

    def lose(self, rid: str) -> None:
        """``rid`` continues a lost chain (requests naming it are counted, not logged)."""
        self._lost[rid] = self.clock()
        self._lost.move_to_end(rid)
        while len(self._lost) > MAX_LOST:
            self._lost.popitem(last=False)

    def after_answer(self, chain: Chain, answer: Answer, key: str | None = None) -> bool:
        """Record the upstream's ``answer`` to a request with ``chain``, under ``key`` (the
        server's :func:`store_key`; None: the response id). Returns True when an entry was kept."""
        key = answer.response_id if key is None else key
        if chain.lost:
            self.lose(key)
            return False
        if not chain.keep:
            return False
        return self.put(key, entry_of(chain, answer))

    def snapshot(self) -> dict[str, int]:
        """For ``GET /loop-guard``: entries and bytes held, entries kept and evicted since start."""
        held = {"entries": len(self._entries), "bytes": self._bytes}
        return {**held, "kept": self.kept, "evicted": self.evicted}
