"""Where a request's time went: the pauses between failover attempts and the wait for a capped
pool's connection are parts of their own (Server-Timing, metrics), never the gateway's overhead,
so an upstream outage does not page as a slow gateway. Every earlier attempt's upstream time
counts as upstream time."""

from __future__ import annotations

import asyncio
import re

import aiohttp
from prometheus_client import REGISTRY

from tests.conftest import BEARER, MESSAGE_HEADERS

RESPONSE = {"model": "respmodel-4o", "input": "hi"}
MESSAGE = {"model": "msgmodel-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
TWO_CHANNELS = """
resilience: {{backoff_s: {backoff}}}
channels:
  - {{name: first, {first}, priority: 0}}
  - {{name: second, base_url: simulator, priority: 1}}
"""


def parts(header: str) -> dict[str, float]:
    """`Server-Timing` as {part: milliseconds}."""
    found = {}
    for part in header.split(", "):
        name, _, rest = part.partition(";")
        duration = re.search(r"dur=([\d.]+)", rest)
        assert duration is not None, header
        found[name] = float(duration[1])
    return found


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_failover_backoff_is_its_own_part_not_overhead(start_gateway, http) -> None:
    gw = await start_gateway(TWO_CHANNELS.format(backoff=1.0, first="base_url: 'http://127.0.0.1:1'"))
    count = sample("modelgate_request_wait_seconds_count", phase="failover_backoff")
    waited = sample("modelgate_request_wait_seconds_sum", phase="failover_backoff")
    overhead = sample("modelgate_overhead_seconds_sum", route="responses")
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200  # the first channel refused the connection; the second served it
        timing = parts(answer.headers["Server-Timing"])
        await answer.read()
    assert set(timing) == {"gateway", "upstream", "backoff"}
    assert timing["backoff"] >= 990  # resilience.backoff_s, slept once
    assert timing["gateway"] < timing["backoff"]  # counted in overhead, it could only be larger
    assert sample("modelgate_request_wait_seconds_count", phase="failover_backoff") == count + 1
    backoff_s = sample("modelgate_request_wait_seconds_sum", phase="failover_backoff") - waited
    assert backoff_s >= 0.99
    assert sample("modelgate_overhead_seconds_sum", route="responses") - overhead < backoff_s
    # Both series exist from the start: a dashboard shows 0, not "no data".
    assert REGISTRY.get_sample_value("modelgate_request_wait_seconds_count", {"phase": "pool_slot"}) is not None


async def test_an_earlier_attempts_upstream_time_is_upstream_time(start_gateway, http) -> None:
    gw = await start_gateway(
        TWO_CHANNELS.format(backoff=0.5, first="base_url: simulator, simulator: {latency_ms: 600, fail_status: 503}")
    )
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200
        timing = parts(answer.headers["Server-Timing"])
    assert len(gw.sim("first").requests) == 1
    assert timing["upstream"] >= 590  # the first channel's 600 ms before its 503, with the second's own
    assert timing["backoff"] >= 490
    assert timing["gateway"] < timing["backoff"] and timing["gateway"] < timing["upstream"]


async def holding_the_one_connection(gw, http, latency_ms: int) -> asyncio.Future:
    """A request the upstream answers after `latency_ms`, sent and seen upstream: it holds the
    channel's one pooled connection meanwhile."""
    holding = asyncio.ensure_future(
        http.post(
            gw.url + "/v1/messages", json=MESSAGE, headers={**MESSAGE_HEADERS, "x-sim-latency-ms": str(latency_ms)}
        )
    )
    async with asyncio.timeout(10):
        while not gw.sim("only").requests:
            await asyncio.sleep(0.01)
    return holding


async def test_a_pool_slot_wait_is_its_own_part(start_gateway, http) -> None:
    gw = await start_gateway("channels: [{name: only, base_url: simulator, pool: {max_connections: 1}}]")
    count = sample("modelgate_request_wait_seconds_count", phase="pool_slot")
    # The one connection the pool may open is held by a request the upstream answers after 800 ms.
    holding = await holding_the_one_connection(gw, http, 800)
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 200
        timing = parts(answer.headers["Server-Timing"])
    (await holding).close()
    assert set(timing) == {"gateway", "upstream", "pool"}
    assert timing["gateway"] < timing["pool"]  # the wait is not the gateway's work
    assert timing["upstream"] < timing["pool"]  # nor the upstream's: it answered this one at once
    assert sample("modelgate_request_wait_seconds_count", phase="pool_slot") == count + 1


async def test_a_full_pool_answers_with_its_wait_in_server_timing(start_gateway, http) -> None:
    gw = await start_gateway(
        "channels: [{name: only, base_url: simulator, timeouts: {connect_s: 0.3},\n"
        "            pool: {max_connections: 1}}]"
    )
    holding = await holding_the_one_connection(gw, http, 3000)
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 503
        assert (await answer.json())["error"]["code"] == "upstream_pool_exhausted"
        timing = parts(answer.headers["Server-Timing"])
    holding.cancel()
    assert timing["pool"] >= 290  # connect_s, waited whole
    assert timing["gateway"] < timing["pool"] and timing["upstream"] < timing["pool"]


async def test_a_request_without_waits_keeps_the_two_parts(gateway, http: aiohttp.ClientSession) -> None:
    async with http.post(gateway.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert re.fullmatch(
            r'gateway;dur=[\d.]+;desc="gateway overhead", upstream;dur=[\d.]+', answer.headers["Server-Timing"]
        )
