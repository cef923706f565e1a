"""GET /loop-guard/metrics: Prometheus text with exact counts, read from the same stats."""

from __future__ import annotations

import dataclasses

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import GuardsConfig
from tests.helpers.fakes import FakeUpstream


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def test_metrics_count_requests_actions_and_added_latency(upstream: FakeUpstream, make_proxy) -> None:
    base = await make_proxy({"guards": {"circuit_breaker": {"enabled": False}}})
    messages: list[dict] = [{"role": "user", "content": "Read app.py"}]
    async with aiohttp.ClientSession() as http:
        for _ in range(5):
            async with http.post(
                f"{base}/v1/chat/completions", json={"model": "m", "messages": messages}
            ) as r:
                msg = (await r.json())["choices"][0]["message"]
            messages.append(msg)
            for tc in msg["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "print('hi')"})
        async with http.get(f"{base}/v1/models") as r:
            await r.read()
        async with http.get(f"{base}/loop-guard/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            samples = _samples(await r.text())

    assert samples[("loopguard_requests_total", ())] == 6
    assert samples[("loopguard_guarded_requests_total", ())] == 5
    # Requests 4 and 5 carry the reminder after call 3 (re-injected); request 5 is not yet at 5.
    assert samples[("loopguard_rewritten_requests_total", ())] == 2
    key = ("loopguard_actions_total", (("kind", "remind"), ("mode", "enforce"), ("rule", "repeat_reminder")))
    assert samples[key] == 1
    assert samples[("loopguard_internal_errors_total", ())] == 0
    assert samples[("loopguard_upstream_errors_total", ())] == 0
    assert samples[("loopguard_added_latency_seconds_count", ())] == 6
    assert samples[("loopguard_added_latency_seconds_bucket", (("le", "+Inf"),))] == 6


async def test_metrics_require_the_admin_token_when_set(upstream: FakeUpstream, make_proxy) -> None:
    base = await make_proxy({"admin_token": "s3cret"})
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/loop-guard/metrics") as r:
            assert r.status == 401
        async with http.get(f"{base}/loop-guard/metrics", headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
            assert "loopguard_requests_total 0.0" in await r.text()


async def test_with_every_guard_off_bodies_are_not_parsed_and_pass_byte_for_byte(
    upstream: FakeUpstream, make_proxy
) -> None:
    names = [f.name for f in dataclasses.fields(GuardsConfig)]  # every guard there is
    base = await make_proxy({"guards": {n: {"enabled": False} for n in names}})
    body = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}]}'
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 200
        async with http.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    assert upstream.requests[-1].body == body
    assert stats["requests"] == 1
    assert stats["guarded_requests"] == 0
