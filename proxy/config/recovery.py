"""The ``recovery`` section: how loopguard helps a looping model out of its loop, beyond the
escalation ladder (reminders, withheld results, stop). Every intervention here is opt-in; the
defaults keep today's behaviour. Measured on a real local model by ``bench/recovery``
(``docs/recovery.md``): an advisory text that quotes the looping call can make a weak model
repeat it, so these change what the model conditions on or how it samples instead.

- ``reminders``: how the proxy's own texts (reminders, denials) speak of the looping call;
- ``collapse``: the upstream sees a run of identical call/result pairs folded into one;
- ``resample``: an answer that repeats a withheld call is asked for again with anti-repetition
  sampling settings;
- ``fallback``: the same answer is asked of a second upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Literal
from urllib.parse import urlsplit

from proxy.config.fields import SECTION, Bool, Bound, Float, Int, Str
from proxy.errors import ConfigError

#: A sampling setting's value as the upstream reads it (``temperature: 1.0``, ``seed: 7``,
#: ``dry_multiplier: 0.8``, ``mirostat: 0``).
SamplingValue = Float | Bool | Str


@dataclass(frozen=True)
class CollapseConfig:
    """Fold a run of identical call/result pairs in the history the upstream sees."""

    __pydantic_config__ = SECTION

    enabled: Bool = False
    """true: a run of at least min_repeats consecutive steps, each one call with the same
    canonical key and the same result (after masking) and nothing else, reaches the upstream as
    its first step and a short note; the agent's own history is not changed. The upstream's
    prefix cache breaks once, at the first folded step."""
    min_repeats: Annotated[Int, Bound(ge=2)] = 3
    """Steps in a run before it is folded (>= 2)."""


@dataclass(frozen=True)
class ResampleConfig:
    """Ask the upstream again when its answer repeats a withheld call."""

    __pydantic_config__ = SECTION

    attempts: Annotated[Int, Bound(ge=0, le=5, note="0 = off")] = 0
    """How many times at most an answer that repeats a call whose result this turn already had
    withheld is asked for again, with the settings below; the first answer that does not repeat
    one is delivered; if none, the answer is decided as without re-sampling (withheld or
    stopped). 0 = off."""
    params: dict[Str, SamplingValue] = field(default_factory=lambda: {"temperature": 1.0})
    """Sampling settings set on the repeated request (top-level keys; Gemini: inside
    generationConfig), each attempt. Only settings the upstream accepts: llama.cpp server
    repeat_penalty, presence_penalty, frequency_penalty, dry_multiplier, temperature; vLLM
    repetition_penalty; hosted APIs temperature (OpenAI also presence_penalty)."""
    new_seed: Bool = True
    """true: each attempt also sets a seed of its own (seed; Gemini generationConfig.seed) where the
    dialect has one, so a deterministic server answers differently."""


@dataclass(frozen=True)
class FallbackConfig:
    """Ask a second upstream (another model) for an answer that repeats a withheld call."""

    __pydantic_config__ = SECTION

    url: Str = ""
    """Base URL of the second upstream, like upstream.url ("http://127.0.0.1:8081/v1"); "" =
    off. Asked once, after the re-sample attempts (if any) all repeated."""
    model: Str = ""
    """The model name sent to it (the body's model; Gemini: the path's model); "" = the agent's."""
    api_key_env: Str = ""
    """Name of an environment variable whose value is sent as its credential (Authorization:
    Bearer; Anthropic x-api-key; Gemini x-goog-api-key) instead of the agent's; "" = the agent's
    own credential headers go to it as they came."""
    timeout_s: Annotated[Float, Bound(gt=0)] = 120.0
    """The longest its answer may take; then the answer is decided as without it."""

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.url:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                yield ConfigError(f"{path}.url", "must be an http(s) base URL, e.g. http://127.0.0.1:8081/v1")


@dataclass(frozen=True)
class RecoveryConfig:
    """How the proxy helps a looping model out (see the module docstring). All off by default."""

    __pydantic_config__ = SECTION

    reminders: Literal["quote", "plain", "redirect"] = "quote"
    """How reminders and denials speak of the looping call. quote: name its tool and show its
    arguments (the seeds' texts). plain: neither its name nor its arguments nor its target, only
    what is true of the history (the same call N times, the same result). redirect: like plain,
    and says what to do instead: use the results already in hand, the offered tools not used
    since the user's last message, or answer the user."""
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    """Fold repeated call/result pairs before the upstream sees them."""
    resample: ResampleConfig = field(default_factory=ResampleConfig)
    """Ask again, with anti-repetition sampling settings."""
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    """Ask a second upstream."""

    def active(self) -> list[str]:
        """The interventions turned on, for the ``listening`` line and ``check-config``: e.g.
        ``["reminders: plain", "collapse (min_repeats 3)", "resample (2 attempts)", "fallback"]``;
        empty with the defaults."""
        out = [f"reminders: {self.reminders}"] if self.reminders != "quote" else []
        if self.collapse.enabled:
            out.append(f"collapse (min_repeats {self.collapse.min_repeats})")
        if self.resample.attempts:
            n = self.resample.attempts
            out.append(f"resample ({n} attempt{'s' if n > 1 else ''})")
        if self.fallback.url:
            out.append("fallback")
        return out
