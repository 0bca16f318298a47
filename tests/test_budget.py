"""Budgets: what a key or a tenant may spend a day or a month, by the price table or in tokens,
held across instances within one request."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

KEY = "budget-key-0001"
OTHER = "budget-key-0002"
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 20, "messages": [{"role": "user", "content": "hi there"}]}
PRICES = 'prices: [{model: "msgmodel-*", input_per_mtok: 3, output_per_mtok: 15}]'


def config(budget: str, extra: str = "", state: str = "", listen: str = "") -> str:
    return f"""
{listen}
{state}
keys:
  - {{name: spender, key: {KEY}, labels: {{tenant: acme}}, budget: {budget}}}
  - {{name: sibling, key: {OTHER}, labels: {{tenant: acme}}}}
channels: [{{name: simulator, base_url: simulator, simulator: {{chunk_delay_ms: 0, output_tokens: 20}}}}]
observability: {{logging: {{access_log: false}}}}
{PRICES}
{extra}
"""


def cost_of(answer: dict[str, Any]) -> float:
    usage = answer["usage"]
    return usage["input_tokens"] * 3e-6 + usage["output_tokens"] * 15e-6


async def test_spending_stops_at_the_budget_with_a_429_saying_when_it_resets(start_gateway, http) -> None:
    gateway = await start_gateway(config("{cost_per_day: 0.002}"))
    spent, statuses, warned = 0.0, [], False
    for _ in range(12):
        async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            statuses.append(answer.status)
            if answer.status == 200:
                spent += cost_of(await answer.json())
                warned = warned or "X-Budget-Warning" in answer.headers
            else:
                refusal, refused_headers = await answer.json(), answer.headers
                retry = int(refused_headers["Retry-After"])
    assert statuses[0] == 200 and statuses[-1] == 429 and statuses == sorted(statuses)
    assert spent <= 0.002 and spent > 0.002 - 2 * cost_of({"usage": {"input_tokens": 10, "output_tokens": 20}})
    assert warned, "past 80% answers said so"
    assert refusal["error"]["type"] == "rate_limit_error" and refusal["error"]["code"] == "budget_exceeded"
    assert re.search(
        r"budget 'key-day-cost' of key:spender \(0.002 in cost a day\) has [\d.e-]+ left, less than "
        r"this request may spend \([\d.e-]+\); it resets at \d{4}-\d\d-\d\dT00:00:00Z",
        refusal["error"]["message"],
    ), refusal["error"]["message"]
    assert 0 < retry <= 86_400 and refused_headers["x-should-retry"] == "false"  # no SDK sleeps out the day
    async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers={**MSG, "x-api-key": OTHER}) as answer:
        assert answer.status == 200  # another key of the tenant: the budget was the key's own


async def test_a_tenant_s_token_budget_counts_every_key_of_it(start_gateway, http) -> None:
    gateway = await start_gateway(config("null", extra="plugins: {budget: {tenants: {acme: {tokens_per_day: 200}}}}"))
    statuses = []
    for index in range(12):
        key = KEY if index % 2 else OTHER
        async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers={**MSG, "x-api-key": key}) as answer:
            statuses.append(answer.status)
            body = await answer.json()
    assert statuses.count(200) >= 5 and statuses[-1] == 429
    assert "budget 'tenant-day-tokens' of tenant:acme (200 tokens a day)" in body["error"]["message"]


async def test_a_key_without_a_budget_runs_none_of_the_budget_s_hooks(start_gateway, http) -> None:
    """A budget named for one key makes the plugin busy, but a key with none (of a tenant with none)
    is not its business (Plugin.takes): no reservation, no coroutine per hook, nothing to settle."""
    from tests.recording_plugin import Recorder

    route = (
        "routes: {messages: {plugins: [auth, ratelimit, budget, usage, sse, ledger, tests.recording_plugin:Recorder]}}"
    )
    gateway = await start_gateway(config("{tokens_per_day: 10000}", extra=route).replace("tenant: acme", "tenant: own"))
    ran = {}
    for name, key in (("spender", KEY), ("sibling", OTHER)):
        async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers={**MSG, "x-api-key": key}) as answer:
            assert answer.status == 200
        exchange = Recorder.finished[-1]
        assert exchange.key.name == name
        ran[name] = [plugin.name for plugin in exchange.pipeline.plugins]
    assert "budget" in ran["spender"] and "budget" not in ran["sibling"]
    assert [name for name in ran["spender"] if name != "budget"] == ran["sibling"]  # the others ran for both


async def test_a_budget_across_three_instances_stops_within_one_request_of_it(spawn, shared_redis) -> None:
    listen = 'server: {listen: "127.0.0.1:{PORT}"}'
    text = config(
        "{cost_per_day: 0.01}",
        listen=listen,
        state=f"state: {{backend: redis, url: '{shared_redis}', prefix: 'budget-{id(shared_redis)}:'}}",
    )
    gateways = [spawn("gateway", config=text) for _ in range(3)]
    gate = asyncio.Semaphore(24)

    async def one(http: aiohttp.ClientSession, index: int) -> float:
        async with gate, http.post(gateways[index % 3].url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            return cost_of(await answer.json()) if answer.status == 200 else 0.0

    async with aiohttp.ClientSession() as http:
        costs = await asyncio.gather(*(one(http, i) for i in range(120)))
    one_request = max(costs)
    assert 0.01 - one_request < sum(costs) <= 0.01
    assert costs.count(0.0) > 0


async def test_a_budget_the_state_store_lost_is_rebuilt_from_the_ledger(
    ledger_db, start_gateway, http, redis_url, tmp_path
) -> None:
    import redis.asyncio as aioredis

    from tests.test_ledger import rows_when

    state = f"state: {{backend: redis, url: '{redis_url}'}}"
    ledger = f"plugins: {{ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{tmp_path}'}}}}"
    gateway = await start_gateway(config("{cost_per_day: 0.002}", state=state, extra=ledger))
    spent = 0.0
    for _ in range(3):
        async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            spent += cost_of(await answer.json())
    await rows_when(ledger_db, 3)
    store = aioredis.Redis.from_url(redis_url)
    try:
        lost = [key async for key in store.scan_iter("modelgate:budget:*")]
        assert lost and await store.delete(*lost) == len(lost)  # a Redis that came back empty
    finally:
        await store.aclose()
    statuses = []
    for index in range(12):
        async with http.post(gateway.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            statuses.append(answer.status)
            if answer.status == 200:
                spent += cost_of(await answer.json())
        if index == 0:
            await asyncio.sleep(0.5)  # the first request after the loss started the counter, and its rebuild
    assert statuses[-1] == 429
    assert 0.002 - cost_of({"usage": {"input_tokens": 10, "output_tokens": 20}}) < spent <= 0.002


async def test_a_stream_left_early_is_settled_by_what_it_streamed(start_gateway, http) -> None:
    """Not by the placeholder count a message stream starts with (nearly free), nor by all it
    reserved (a key of a tenant could then spend the tenant's budget on nothing)."""
    gateway = await start_gateway(config("{tokens_per_day: 100000}"))
    slow = {**MSG, "x-sim-chunk-delay-ms": "2", "x-sim-output-tokens": "400"}
    answer = await http.post(
        gateway.url + "/v1/messages", headers=slow, json={**MESSAGE, "max_tokens": 2000, "stream": True}
    )
    for _ in range(120):
        await answer.content.readuntil(b"event: content_block_delta")
    answer.close()
    await asyncio.sleep(0.3)
    counters = gateway.owner.resources["budget.memory"]
    [spent] = [value for key, (value, _) in counters._values.items() if ":tokens:" in key]
    assert 120 <= spent < 400  # the prompt's 2 tokens and about one an event streamed


async def test_a_model_the_price_table_does_not_price_is_refused_under_a_cost_budget(start_gateway, http) -> None:
    gateway = await start_gateway(config("{cost_per_day: 1}"))
    unpriced = {"model": "respmodel-4o", "input": "hi"}
    async with http.post(gateway.url + "/v1/responses", json=unpriced, headers={"Authorization": f"Bearer {KEY}"}) as a:
        assert a.status == 403 and (await a.json())["error"]["code"] == "model_not_priced"
    other = {"Authorization": f"Bearer {OTHER}"}
    async with http.post(gateway.url + "/v1/responses", json=unpriced, headers=other) as a:
        assert a.status == 200  # a key without a cost budget is not held to the table


def test_check_config_says_which_budgets_could_never_hold() -> None:
    from proxy.config import ConfigError
    from proxy.registry import parse_config

    with pytest.raises(ConfigError) as refused:
        parse_config(
            "keys: [{name: a, key: budget-key-9, labels: {tenant: acme}, budget: {cost_per_day: 1}}]\n"
            "plugins: {budget: {tenants: {acmee: {tokens_per_day: 5}}}}",
            {},
        )
    assert refused.value.problems == [
        "keys[0].budget: a cost budget, and no prices: every request would cost 0 (add `prices`, docs/ledger.md)",
        "plugins.budget.tenants.acmee: no key has the tenant label 'acmee'",
    ]


async def test_the_sdks_raise_a_budget_refusal_at_once_rather_than_sleep_until_it_resets(start_gateway) -> None:
    import time

    import anthropic
    import openai

    gateway = await start_gateway(config("{tokens_per_day: 50}"))  # the first request leaves less than one more takes
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=KEY)
    hello = [{"role": "user", "content": "hi"}]
    await client.messages.create(model="msgmodel-haiku-4-5", max_tokens=20, messages=hello)
    started = time.monotonic()
    async with asyncio.timeout(20):  # an SDK sleeping out Retry-After (hours) fails here, not the suite's budget
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(
                model="msgmodel-haiku-4-5", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.body["error"]["code"] == "budget_exceeded"  # type: ignore[index]
        with pytest.raises(openai.RateLimitError):
            await openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=KEY).responses.create(
                model="respmodel-4o", input="hi"
            )
    assert time.monotonic() - started < 5, "each SDK took the refusal as final (x-should-retry: false)"
