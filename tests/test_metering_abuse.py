"""Metering that cannot leak, tried as a hostile tenant would: one key with a budget, the simulator's
`x-sim-output-tokens` standing in for an expensive upstream, Redis state and a PostgreSQL ledger.

Each case asserts that the key's budget counter and its ledger rows agree, and that they account
for what the simulator says it produced (`Simulator.produced`), within the documented estimate
(docs/budgets.md, docs/ledger.md)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import textwrap
import time
from datetime import datetime, timezone
from typing import Any

import aiohttp
import pytest

from proxy.config import ConfigError
from proxy.core import jsonutil
from proxy.registry import parse_config
from tests.conftest import Process
from tests.test_lease_heartbeat import LIMIT as LEASED
from tests.test_lease_heartbeat import gateway_config as lease_config
from tests.test_lease_heartbeat import open_stream, refused, worker_of
from tests.test_ledger import rows
from tests.test_workers import children

KEY = "sk-metering-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
PRICES = """
prices:
  - {model: "respmodel-*", input_per_mtok: 2.5, output_per_mtok: 10, max_output_tokens: 64000}
  - {model: "msgmodel-*", input_per_mtok: 3, output_per_mtok: 15}
  - {model: "genmodel-*", input_per_mtok: 1, output_per_mtok: 4, max_output_tokens: 8192}
  - {model: "imagegen-*", per_image: 0.04, max_output_tokens: 1100}
  - {model: "videogen-*", per_video_second: 0.5}
"""
SIMULATOR = (
    "{name: simulator, base_url: simulator, simulator: {chunk_delay_ms: 0, output_tokens: 20, "
    "video_queued_s: 0, video_processing_s: 0}}"
)


# Checks wait up to 5 s on Redis: a loaded test host can stall half a second, and a budget that
# failed open then would let these tests' hostile requests through.
def metered(
    redis_url: str,
    ledger_db: str,
    spool: str,
    keys: str,
    budget: str = "{}",
    prices: str = PRICES,
    check_timeout_s: float = 5,
) -> str:
    return (
        textwrap.dedent(f"""
        state: {{backend: redis, url: '{redis_url}', check_timeout_s: {check_timeout_s}}}
        keys: {keys}
        channels: [{SIMULATOR}]
        observability: {{logging: {{access_log: false}}}}
        plugins:
          ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{spool}'}}
          budget: {budget}
        """)
        + prices
    )


@pytest.fixture
async def gateway_with(ledger_db, redis_url, start_gateway, tmp_path):
    """A gateway whose key `spender` has the budget given (YAML flow text)."""

    async def start(budget: str, settings: str = "{}") -> Any:
        keys = f"[{{name: spender, key: {KEY}, budget: {budget}}}]"
        return await start_gateway(metered(redis_url, ledger_db, str(tmp_path / "spool"), keys, settings))

    return start


async def counter(redis_url: str, name: str, measure: str = "tokens") -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        found = await client.get(f"modelgate:budget:key:{name}:{measure}:{day}")
        return float(found or 0)
    finally:
        await client.aclose()


def spent(found: list[Any], measure: str = "tokens") -> float:
    if measure == "cost":
        return sum(float(r["cost"]) for r in found)
    return sum((r["input_tokens"] or 0) + (r["output_tokens"] or 0) for r in found)


async def agreed(
    redis_url: str,
    ledger_db: str,
    count: int,
    name: str = "spender",
    measure: str = "tokens",
    within_s: float = 15.0,
    settled: int = 0,
) -> tuple[float, list[Any]]:
    """The key's counter and its ledger rows once there are `count` rows whose sum is the counter
    (`settled` of them no longer pending): the two must come to agree (the rows arrive in batches);
    the test fails if they never do."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        found = [r for r in await rows(ledger_db) if r["key_name"] == name]
        held = await counter(redis_url, name, measure)
        if (
            len(found) >= count
            and sum(not r["pending"] for r in found) >= settled
            and spent(found, measure) == pytest.approx(held, rel=1e-9, abs=1e-9)
        ):
            return held, found
        if loop.time() > deadline:
            raise AssertionError(f"counter {held} and ledger {spent(found, measure)} ({len(found)} rows) never agreed")
        await asyncio.sleep(0.1)


def prompt_tokens(body: dict[str, Any]) -> int:
    """A prompt as the gateway estimates it (four bytes of body a token), for the body aiohttp sends."""
    from proxy.core import jsonutil

    return math.ceil(len(jsonutil.dumps(body)) / 4)


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    from proxy.core import jsonutil

    async with http.post(
        url, data=jsonutil.dumps(body), headers={**headers, "content-type": "application/json"}
    ) as answer:
        return answer.status, await answer.json(content_type=None)


# 1 -----------------------------------------------------------------------------------------------


async def test_1_a_background_response_is_charged_where_its_result_is_read(gateway_with, http, redis_url, ledger_db):
    gateway = await gateway_with("{tokens_per_day: 200000}")
    sim = gateway.sim()
    expensive = {**AUTH, "x-sim-output-tokens": "50000"}
    body = {"model": "respmodel-4o", "input": "write the long report", "background": True}  # no limit: 64000
    answers = await asyncio.gather(*(post(http, gateway.url + "/v1/responses", body, expensive) for _ in range(4)))
    made = [a for status, a in answers if status == 200]
    assert len(made) == 3 and [s for s, _ in answers].count(429) == 1  # three reservations fit in 200,000
    assert all(a["status"] == "queued" and a["usage"] is None for a in made)
    most = 64000 + prompt_tokens(body)
    held, found = await agreed(redis_url, ledger_db, 4)
    assert held == 3 * most  # nothing known yet: every token it may make is held
    assert sorted(r["pending"] for r in found if r["status"] == 200) == [True] * 3
    assert sim.produced["output_tokens"] == 150000  # the upstream made it all, answered or not

    # Read back: twice as JSON, once as a stream resumed; each settles its generation once.
    for response in made[:2]:
        async with http.get(f"{gateway.url}/v1/responses/{response['id']}", headers=AUTH) as answer:
            assert (await answer.json())["usage"]["output_tokens"] == 50000
    async with http.get(f"{gateway.url}/v1/responses/{made[2]['id']}?stream=true", headers=AUTH) as answer:
        assert b"response.completed" in await answer.read()
    for response in made:  # read again: nothing changes
        async with http.get(f"{gateway.url}/v1/responses/{response['id']}", headers=AUTH) as answer:
            assert answer.status == 200
    produced = sim.produced["input_tokens"] + sim.produced["output_tokens"]
    held, found = await agreed(redis_url, ledger_db, 4)
    while any(r["pending"] for r in found):
        await asyncio.sleep(0.1)
        held, found = await agreed(redis_url, ledger_db, 4)
    assert held == produced  # exactly what the upstream made and reported
    settled = [r for r in found if r["status"] == 200]
    assert all(r["output_tokens"] == 50000 and not r["estimated"] and r["settled_at"] for r in settled)
    await days_agree(ledger_db)  # the spend by day the console reads moved with the settling


async def days_agree(database_url: str) -> None:
    """The ledger's day rows (the console's spend) sum to what its rows do, row for row of each day."""
    import asyncpg

    connection = await asyncpg.connect(database_url)
    try:
        by_rows = await connection.fetch(
            "SELECT (at AT TIME ZONE 'UTC')::date AS day, coalesce(tenant, '') AS tenant, status, count(*) AS requests, "
            "coalesce(sum(output_tokens), 0) AS output_tokens, sum(cost) AS cost, "
            "count(*) FILTER (WHERE pending) AS pending FROM usage_records GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        )
        by_days = await connection.fetch(
            "SELECT day, tenant, status, sum(requests) AS requests, sum(output_tokens) AS output_tokens, "
            "sum(cost) AS cost, sum(pending) AS pending FROM usage_daily GROUP BY 1, 2, 3 "
            "HAVING sum(requests) <> 0 ORDER BY 1, 2, 3"
        )
    finally:
        await connection.close()
    assert [dict(r) for r in by_days] == [dict(r) for r in by_rows] and by_rows


async def test_1_a_background_result_nobody_reads_or_cancelled_unsaid_stays_charged_at_its_reservation(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    running = {**AUTH, "x-sim-output-tokens": "30000", "x-sim-background-ms": "60000"}
    body = {"model": "respmodel-4o", "input": "go", "background": True, "max_output_tokens": 40000}
    unread = (await post(http, gateway.url + "/v1/responses", body, running))[1]
    cancelled = (await post(http, gateway.url + "/v1/responses", body, running))[1]
    async with http.get(f"{gateway.url}/v1/responses/{unread['id']}", headers=AUTH) as answer:
        assert (await answer.json())["status"] == "in_progress"  # not ended: nothing to settle yet
    async with http.post(f"{gateway.url}/v1/responses/{cancelled['id']}/cancel", headers=AUTH) as answer:
        assert (await answer.json()) | {"usage": None} == (await answer.json())  # it says nothing of its usage
    most = 40000 + prompt_tokens(body)
    # The cancelled row is written pending, then again settled at what it held: the sums agree
    # either way, so wait for the settlement itself.
    held, found = await agreed(redis_url, ledger_db, 2, settled=1)
    assert held == 2 * most
    by_id = {r["pending"]: r for r in found}
    assert by_id[True]["output_tokens"] == 40000  # unread: pending at its reservation
    assert by_id[False]["estimated"] and by_id[False]["output_tokens"] == 40000  # cancelled, unsaid: settled at it
    assert gateway.sim().produced["output_tokens"] <= 2 * 40000


async def test_1_a_held_reservation_is_settled_once_by_any_instance_in_every_topology(
    shared_redis, ledger_db, start_gateway, spawn, http, tmp_path
) -> None:
    await settled_once(
        f"state: {{backend: redis, url: '{shared_redis}'}}", 2, ledger_db, start_gateway, spawn, http, tmp_path
    )


async def test_1_a_held_reservation_is_settled_once_with_memory_state(
    ledger_db, start_gateway, spawn, http, tmp_path
) -> None:
    await settled_once("", 1, ledger_db, start_gateway, spawn, http, tmp_path)


async def settled_once(
    state: str,
    instances: int,
    ledger_db: str,
    start_gateway: Any,
    spawn: Any,
    http: aiohttp.ClientSession,
    tmp_path: Any,
) -> None:
    """Two generations left running, each read ten times at once on another instance than made
    it: each is settled once, and only the room it held beyond what it spent comes back."""
    upstream = spawn("simulator")
    text = (
        textwrap.dedent(f"""
        {state}
        keys: [{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]
        channels: [{{name: up, base_url: "{upstream.url}"}}]
        observability: {{logging: {{access_log: false}}}}
        plugins: {{ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{tmp_path}'}}}}
        """)
        + PRICES
    )
    gateways = [await start_gateway(text) for _ in range(instances)]
    first, last = gateways[0], gateways[-1]
    body = {"model": "respmodel-4o", "input": "go", "background": True, "max_output_tokens": 40000}
    expensive = {**AUTH, "x-sim-output-tokens": "10000"}
    made = [(await post(http, first.url + "/v1/responses", body, expensive))[1] for _ in range(2)]
    assert (await post(http, last.url + "/v1/responses", body, expensive))[0] == 429  # 80,000 and more held

    async def read(response_id: str) -> int:
        async with http.get(f"{last.url}/v1/responses/{response_id}", headers=AUTH) as answer:
            return (await answer.json())["usage"]["output_tokens"]

    assert await asyncio.gather(*(read(r["id"]) for r in made for _ in range(10))) == [10000] * 20
    assert (await post(http, first.url + "/v1/responses", body, expensive))[0] == 200  # settled, wherever read
    assert (await post(http, last.url + "/v1/responses", body, expensive))[0] == 429  # and once: no more room
    prompt = prompt_tokens(body)
    spent = 2 * (10000 + 1) + 40000 + prompt  # two settled (the simulator counts one word of prompt), one held
    deadline = asyncio.get_running_loop().time() + 15
    while sum((r["input_tokens"] or 0) + (r["output_tokens"] or 0) for r in await rows(ledger_db)) != spent:
        assert asyncio.get_running_loop().time() < deadline, await rows(ledger_db)
        await asyncio.sleep(0.1)


# 2 -----------------------------------------------------------------------------------------------


async def test_2_a_decoy_limit_never_shrinks_a_reservation(gateway_with, http, redis_url, ledger_db) -> None:
    gateway = await gateway_with("{tokens_per_day: 50000}")
    sim = gateway.sim()
    decoy = {"model": "respmodel-4o", "input": "hi", "max_tokens": 1, "max_output_tokens": 40000}
    answers = await asyncio.gather(
        *(post(http, gateway.url + "/v1/responses", decoy, {**AUTH, "x-sim-output-tokens": "30000"}) for _ in range(10))
    )
    statuses = [status for status, _ in answers]
    assert statuses.count(200) == 1 and statuses.count(429) == 9  # one 40,000-token reservation at a time
    assert sim.produced["input_tokens"] + sim.produced["output_tokens"] <= 50000
    held, _ = await agreed(redis_url, ledger_db, 10)
    assert held == sim.produced["input_tokens"] + sim.produced["output_tokens"]

    # What other requests reserve, as the refusal of one that could never fit says it.
    async def most_of(path: str, body: dict[str, Any], headers: dict[str, str]) -> int:
        status, refusal = await post(http, gateway.url + path, body, headers)
        assert status == 429, refusal
        message = str(refusal)
        return int(message.split("may spend up to ")[1].split(" ")[0])

    prompt = prompt_tokens
    reverse = {"model": "respmodel-4o", "input": "hi", "max_output_tokens": 1, "max_tokens": 90000}
    assert await most_of("/v1/responses", reverse, AUTH) == 90000 + prompt(reverse)
    unnamed = {"model": "respmodel-4o", "input": "hi " * 20}  # the model's own default, from the price table
    assert await most_of("/v1/responses", unnamed, AUTH) == 64000 + prompt(unnamed)
    floated = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 100,
        "max_output_tokens": 60000.0,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert await most_of("/v1/messages", floated, MSG) == 60000 + prompt(floated)
    candidates = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "max_tokens": "20000",
        "generationConfig": {"maxOutputTokens": 10, "candidateCount": 4},
    }
    assert await most_of(
        f"/v1beta/models/genmodel-2.0-flash:generateContent?key={KEY}", candidates, {}
    ) == 4 * 20000 + prompt(candidates)


async def test_2_a_form_is_reserved_for_what_it_names_after_its_files_before_the_upstream_has_all_of_it(
    gateway_with, http, redis_url, ledger_db
) -> None:
    from pathlib import Path

    gateway = await gateway_with("{cost_per_day: 0.3}")
    sim = gateway.sim()
    photo = (Path(__file__).parent.parent / "examples" / "photo.png").read_bytes()

    def form(before: dict[str, str], after: dict[str, str]) -> aiohttp.FormData:
        made = aiohttp.FormData()
        for name, value in {"model": "imagegen-2", "prompt": "make it blue", **before}.items():
            made.add_field(name, value)
        made.add_field("image[]", photo, filename="photo.png", content_type="image/png")
        for name, value in after.items():
            made.add_field(name, value)
        return made

    async def edit(before: dict[str, str], after: dict[str, str]) -> tuple[int, Any]:
        async with http.post(gateway.url + "/v1/images/edits", data=form(before, after), headers=AUTH) as answer:
            return answer.status, await answer.json()

    assert (await edit({"n": "2"}, {}))[0] == 200  # fields first, as the SDKs send them: 2 images reserved
    status, refusal = await edit({}, {"n": "9"})  # 9 named after the file: 0.36, more than the whole budget
    assert (status, refusal["error"]["code"]) == (429, "budget_exceeded"), refusal
    assert sim.produced["images"] == 2  # the upstream never had the whole of that form
    assert (await edit({}, {"n": "5"}))[0] == 200  # 0.08 spent, 0.2 more fits
    assert (await edit({}, {"n": "3"}))[0] == 429  # 0.28 spent: no room for 0.12
    held, found = await agreed(redis_url, ledger_db, 4, measure="cost")
    assert held == pytest.approx(7 * 0.04) and sim.produced["images"] == 7


@pytest.mark.parametrize(
    "written, read",
    [
        (40000, 40000),
        (40000.0, 40000),
        (40000.5, 40001),
        ("40000", 40000),
        (" 40000 ", 40000),
        ("4e4", 40000),
        ("+40000", 40000),
        ("000040000", 40000),
        ("40000.0", 40000),
        (0, None),
        (-5, None),
        (True, None),
        ("\u00b2", None),
        ("\u2460", None),
        ("\uff11\uff12", None),
        ("400_000", None),
        ("1e400", None),
        ({}, None),
        (float("inf"), None),
        (2**40, 2**31),
    ],
)
def test_2_a_count_is_read_as_a_lax_upstream_may_read_it(written, read) -> None:
    from proxy.formats.counts import count

    assert count(written) == read


async def test_2_a_count_named_twice_goes_upstream_as_the_one_reserved_for(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 50000}")
    raw = b'{"model": "respmodel-4o", "input": "hi", "max_output_tokens": 40000, "max_output_tokens": 20}'
    async with http.post(
        gateway.url + "/v1/responses", data=raw, headers={**AUTH, "content-type": "application/json"}
    ) as answer:
        assert answer.status == 200
    sent = gateway.last_upstream_request().body
    assert sent.count(b"max_output_tokens") == 1 and b'"max_output_tokens":20' in sent  # as the gateway read it


async def test_2_a_video_naming_its_seconds_twice_is_charged_the_longer(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{cost_per_day: 100}")
    body = {
        "model": "videogen-3.0-generate-001",
        "prompt": "waves",
        "seconds": "8",
        "metadata": {"durationSeconds": 4, "sampleCount": 2},
    }
    assert (await post(http, gateway.url + "/v1/videos", body, AUTH))[0] == 200
    held, [row] = await agreed(redis_url, ledger_db, 1, measure="cost")
    assert row["video_seconds"] == 16 and held == 8.0


async def test_1_a_background_stream_left_before_its_id_came_is_charged_all_it_may_make(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    body = {"model": "respmodel-4o", "input": "go", "background": True, "stream": True, "max_output_tokens": 30000}
    headers = {
        **AUTH,
        "x-sim-output-tokens": "20000",
        "x-sim-split": "1",
        "x-sim-chunk-delay-ms": "2000",
        "content-type": "application/json",
    }
    answer = await http.post(gateway.url + "/v1/responses", data=jsonutil.dumps(body), headers=headers)
    answer.close()  # gone with the answer's head, its first event (the id) still on its way
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert held == 30000 + prompt_tokens(body) >= gateway.sim().produced["output_tokens"]
    assert (row["cut_by"], row["estimated"], row["pending"]) == ("client", True, False)  # nothing can settle it


async def test_1_a_read_that_comes_before_the_hold_does_not_stop_a_later_one_settling(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    body = {"model": "respmodel-4o", "input": "go", "background": True, "stream": True, "max_output_tokens": 30000}
    headers = {**AUTH, "x-sim-output-tokens": "300", "x-sim-chunk-delay-ms": "20"}
    answer = await http.post(gateway.url + "/v1/responses", json=body, headers=headers)
    created = await answer.content.readuntil(b"\n\n")
    response_id = created.split(b'"id":"')[1].split(b'"')[0].decode()
    async with http.get(f"{gateway.url}/v1/responses/{response_id}", headers=AUTH) as early:
        assert (await early.json())["status"] == "completed"  # it ended upstream; its hold is not made yet
    answer.close()  # the stream left before its end: its reservation is held now
    await asyncio.sleep(0.3)
    async with http.get(f"{gateway.url}/v1/responses/{response_id}", headers=AUTH) as later:
        assert later.status == 200
    held, [row] = await agreed(redis_url, ledger_db, 1)
    deadline = asyncio.get_running_loop().time() + 10
    while row["pending"]:
        assert asyncio.get_running_loop().time() < deadline, row
        held, [row] = await agreed(redis_url, ledger_db, 1)
    assert held == 300 + 1 and row["output_tokens"] == 300  # settled by the later read


# 3 -----------------------------------------------------------------------------------------------


async def test_3_a_client_gone_before_its_answer_pays_for_its_prompt(gateway_with, http, redis_url, ledger_db) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 4000, "messages": [{"role": "user", "content": "x " * 400}]}
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.5):
            await post(http, gateway.url + "/v1/messages", body, {**MSG, "x-sim-latency-ms": "3000"})
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert (row["status"], row["client_aborted"], row["cut_by"], row["estimated"]) == (499, True, "client", True)
    assert row["input_tokens"] == prompt_tokens(body) and row["output_tokens"] == 0
    assert held == prompt_tokens(body) >= gateway.sim().produced["input_tokens"]  # it went before a token was made


# 4 -----------------------------------------------------------------------------------------------


async def test_4_every_video_a_submission_asks_for_is_charged_and_past_the_models_most_is_refused(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{cost_per_day: 100}")
    sim = gateway.sim()
    status, refusal = await post(
        http,
        gateway.url + "/v1/video/generations",
        {"model": "videogen-3.0-generate-001", "prompt": "waves", "metadata": {"sampleCount": 17}},
        AUTH,
    )
    assert status == 400 and "sampleCount" in refusal["error"]["message"]
    four = {
        "model": "videogen-3.0-generate-001",
        "prompt": "waves",
        "metadata": {"sampleCount": 4, "durationSeconds": 8},
    }
    failing = {"model": "videogen-3.0-generate-001", "prompt": "waves [sim:fail]", "metadata": {"sampleCount": 2}}
    made = [
        (await post(http, gateway.url + "/v1/video/generations", body, AUTH))[1]["task_id"] for body in (four, failing)
    ]
    held, found = await agreed(redis_url, ledger_db, 3, measure="cost")
    assert held == (32 + 16) * 0.5 and all(r["pending"] for r in found if r["status"] == 200)
    for task_id in made:  # the polls tell how each ended: the failed one made nothing the upstream bills
        async with http.get(f"{gateway.url}/v1/video/generations/{task_id}", headers=AUTH) as answer:
            assert answer.status == 200
    await asyncio.sleep(0.3)
    held, found = await agreed(redis_url, ledger_db, 5, measure="cost")
    assert held == 32 * 0.5 == sim.produced["video_seconds"] * 0.5
    made_rows = [r for r in found if r["route"] == "video_generations" and r["status"] == 200]
    assert sorted((r["video_seconds"], r["pending"]) for r in made_rows) == [(0, False), (32, False)]


# 5 -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, headers, body",
    [
        (
            "/v1/messages",
            MSG,
            {
                "model": "msgmodel-haiku-4-5",
                "max_tokens": 900,
                "stream": True,
                "messages": [{"role": "user", "content": "tell me"}],
            },
        ),
        (
            "/v1/responses",
            AUTH,
            {"model": "respmodel-4o", "input": "tell me", "stream": True, "max_output_tokens": 900},
        ),
        (
            f"/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={KEY}",
            {},
            {"contents": [{"parts": [{"text": "tell me"}]}], "generationConfig": {"maxOutputTokens": 900}},
        ),
    ],
)
async def test_5_a_stream_without_usage_is_estimated_from_what_it_delivered(
    gateway_with, http, redis_url, ledger_db, path, headers, body
) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    sim = gateway.sim()
    async with http.post(
        gateway.url + path, json=body, headers={**headers, "x-sim-no-usage": "1", "x-sim-output-tokens": "500"}
    ) as answer:
        events = (await answer.read()).count(b"data:")
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert row["estimated"] and row["status"] == 200 and row["cut_by"] is None
    assert row["output_tokens"] == events  # one token an event delivered
    assert sim.produced["output_tokens"] <= row["output_tokens"] <= sim.produced["output_tokens"] + 10
    assert held == row["input_tokens"] + row["output_tokens"]


# 6 -----------------------------------------------------------------------------------------------


async def test_6_a_stream_cut_short_says_by_whom_and_a_running_count_is_an_estimate(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 100000}")
    sim = gateway.sim()
    broken = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 900,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me"}],
    }
    async with http.post(
        gateway.url + "/v1/messages",
        json=broken,
        headers={**MSG, "x-sim-output-tokens": "300", "x-sim-fault": "drop-after=12"},
    ) as answer:
        assert answer.status == 200 and b"event: error" in await answer.read()
    content = {"contents": [{"parts": [{"text": "tell me"}]}], "generationConfig": {"maxOutputTokens": 900}}
    answer = await http.post(
        f"{gateway.url}/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={KEY}",
        json=content,
        headers={"x-sim-output-tokens": "300", "x-sim-chunk-delay-ms": "20"},
    )
    for _ in range(5):
        await answer.content.readuntil(b"\r\n\r\n")
    answer.close()  # the client leaves: the upstream's running count is not its last word
    held, found = await agreed(redis_url, ledger_db, 2)
    by_route = {r["route"]: r for r in found}
    cut = by_route["messages"]
    assert (cut["status"], cut["cut_by"], cut["estimated"]) == (200, "upstream", True)
    left = by_route["stream_generate_content"]
    assert (left["cut_by"], left["client_aborted"], left["estimated"]) == ("client", True, True)
    assert sim.produced["output_tokens"] <= cut["output_tokens"] + left["output_tokens"] + 2  # events in flight


def test_6_check_config_names_a_budget_or_price_table_a_configured_pipeline_cannot_enforce() -> None:
    text = (
        textwrap.dedent("""
        keys: [{name: spender, key: sk-metering-0001, budget: {tokens_per_day: 1000}}]
        routes:
          messages: {plugins: [auth, validation, ratelimit, usage, sse]}
          responses: {plugins: [auth, validation, ratelimit, budget, usage, sse, ledger]}
          response_retrieve: {plugins: [auth, validation, ratelimit, usage, sse, ledger]}
          generate_content: {plugins: [auth, validation, ratelimit, budget, sse, ledger]}
        """)
        + PRICES
    )
    with pytest.raises(ConfigError) as refused:
        parse_config(text, {})
    problems = [p for p in refused.value.problems if p.startswith("routes.")]
    assert any(
        p.startswith("routes.messages.plugins: leaves out budget, so keys[0].budget does not hold") for p in problems
    ), problems
    assert any(
        p.startswith("routes.messages.plugins: leaves out ledger, so its requests are neither priced") for p in problems
    ), problems
    assert any(p.startswith("routes.response_retrieve.plugins: leaves out budget") for p in problems), problems
    assert (
        "routes.generate_content.plugins[3]: budget uses the usage read from whole answers, which no plugin of "
        "route generate_content's pipeline provides (add usage): every answer would be charged its most" in problems
    )
    assert not any(p.startswith("routes.responses") for p in problems), problems


# 7 -----------------------------------------------------------------------------------------------


async def test_7_a_key_at_its_budget_still_polls_downloads_and_reads_what_it_paid_for(
    gateway_with, http, redis_url, ledger_db
) -> None:
    gateway = await gateway_with("{tokens_per_day: 600, cost_per_day: 5}")
    status, response = await post(
        http,
        gateway.url + "/v1/responses",
        {"model": "respmodel-4o", "input": "hi", "max_output_tokens": 500},
        {**AUTH, "x-sim-output-tokens": "450"},
    )
    assert status == 200
    video = {"model": "videogen-3.0-generate-001", "prompt": "waves", "metadata": {"durationSeconds": 8}}
    status, task = await post(http, gateway.url + "/v1/video/generations", video, AUTH)
    assert status == 200  # 4.0 of the 5 in cost; the tokens spent leave no room for another response
    for path, body, headers in (
        ("/v1/video/generations", video, AUTH),
        ("/v1/responses", {"model": "respmodel-4o", "input": "hi", "max_output_tokens": 500}, AUTH),
    ):
        assert (await post(http, gateway.url + path, body, headers))[0] == 429
    task_id = task["task_id"]
    follow_ups = [
        ("GET", f"/v1/video/generations/{task_id}"),
        ("GET", f"/v1/videos/{task_id}"),
        ("GET", f"/v1/videos/{task_id}/content"),
        ("GET", "/v1/videos"),
        ("GET", f"/v1/responses/{response['id']}"),
        ("GET", f"/v1/responses/{response['id']}/input_items"),
        ("GET", "/v1/models"),
        ("DELETE", f"/v1/responses/{response['id']}"),
    ]
    for method, path in follow_ups:
        async with http.request(method, gateway.url + path, headers=AUTH) as answer:
            await answer.read()
            assert answer.status == 200, (path, answer.status)
    held, found = await agreed(redis_url, ledger_db, 7, measure="cost")  # a row per endpoint request
    assert held == pytest.approx(4 + sum(float(r["cost"]) for r in found if r["route"] == "responses"))


# 8 -----------------------------------------------------------------------------------------------


async def test_8_a_killed_worker_s_leases_are_reclaimed_within_seconds(spawn, shared_redis: str) -> None:
    """Kill -9 of a worker holding leases: within 10 s the key runs its full 10 at once again,
    while the leases the other worker holds keep counting."""
    upstream = spawn("simulator")
    gateway: Process = spawn("gateway", config=lease_config(shared_redis, upstream.url, workers=2))
    port = int(gateway.url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as http:
        held = [await open_stream(http, gateway.url) for _ in range(LEASED)]
        streams = [s for s in held if s is not None]
        assert len(streams) == LEASED and await refused(http, gateway.url)
        workers = children(gateway.proc.pid)
        by_worker = {pid: [s for s in streams if worker_of(s, port, workers) == pid] for pid in workers}
        victim = max(by_worker, key=lambda pid: len(by_worker[pid]))
        running = [s for pid, served in by_worker.items() if pid != victim for s in served]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        # Right after the kill its leases still count: the key is full.
        assert await refused(http, gateway.url)
        refusals = 0
        while len(running) < LEASED:
            assert time.monotonic() - killed_at < 10, f"{len(running)} of {LEASED} at once 10 s after the kill"
            stream = await open_stream(http, gateway.url)
            if stream is None:
                refusals += 1
                await asyncio.sleep(0.2)
            else:
                running.append(stream)
        reclaimed_s = time.monotonic() - killed_at
        assert refusals > 0 and reclaimed_s > 1, "the dead worker's leases were counted until they lapsed"
        # Ten at once, the survivors' among them: an eleventh is refused.
        assert await refused(http, gateway.url)
        for stream in [*streams, *running]:
            stream.close()


# The sweep ---------------------------------------------------------------------------------------

# The same table, its models' own defaults small enough for a budget of 10,000 tokens.
SWEEP_PRICES = PRICES.replace("max_output_tokens: 64000", "max_output_tokens: 2000").replace(
    "max_output_tokens: 8192", "max_output_tokens: 2000"
)
BUDGET = 10_000
CONTENT = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={KEY}"
CONTENT_STREAM = f"/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={KEY}"


def _message(**fields: Any) -> dict[str, Any]:
    return {"model": "msgmodel-haiku-4-5", "messages": [{"role": "user", "content": "tell me a story"}], **fields}


def _response(**fields: Any) -> dict[str, Any]:
    return {"model": "respmodel-4o", "input": "tell me a story", **fields}


def _content(**config: Any) -> dict[str, Any]:
    return {"contents": [{"parts": [{"text": "tell me a story"}]}], "generationConfig": config}


_IMAGE = {"model": "imagegen-1", "prompt": "a lighthouse", "size": "1024x1024"}
_VIDEO = {"model": "videogen-3.0-generate-001", "prompt": "waves", "metadata": {"sampleCount": 4}}
# (case, path, headers, body, how the client reads: whole | before_head (gone before the answer) |
# mid_stream (gone after a few events)); the output the upstream makes is x-sim-output-tokens: 600.
SWEEP: list[tuple[str, str, dict[str, str], dict[str, Any], str]] = [
    ("background", "/v1/responses", AUTH, _response(background=True, max_output_tokens=800), "whole"),
    (
        "background stream",
        "/v1/responses",
        AUTH,
        _response(background=True, stream=True, max_output_tokens=800),
        "mid_stream",
    ),
    ("gone before head: messages", "/v1/messages", MSG, _message(max_tokens=800), "before_head"),
    ("gone before head: content", CONTENT, {}, _content(maxOutputTokens=800), "before_head"),
    ("gone before head: responses", "/v1/responses", AUTH, _response(max_output_tokens=800), "before_head"),
    ("gone before head: images", "/v1/images/generations", AUTH, _IMAGE, "before_head"),
    ("gone mid-stream: messages", "/v1/messages", MSG, _message(max_tokens=800, stream=True), "mid_stream"),
    ("gone mid-stream: content", CONTENT_STREAM, {}, _content(maxOutputTokens=800), "mid_stream"),
    ("gone mid-stream: responses", "/v1/responses", AUTH, _response(max_output_tokens=800, stream=True), "mid_stream"),
    ("decoy: messages", "/v1/messages", MSG, _message(max_tokens=800, max_output_tokens=1), "whole"),
    ("decoy: responses", "/v1/responses", AUTH, _response(max_output_tokens=800, max_tokens=1), "whole"),
    ("decoy: content", CONTENT, {}, {**_content(maxOutputTokens=800), "max_tokens": 1}, "whole"),
    ("missing limit: responses", "/v1/responses", AUTH, _response(), "whole"),
    ("missing limit: content", CONTENT, {}, _content(), "whole"),
    ("missing limit: messages", "/v1/messages", MSG, _message(), "whole"),
    ("missing limit: images", "/v1/images/generations", AUTH, _IMAGE, "whole"),
    ("most images", "/v1/images/generations", AUTH, {**_IMAGE, "n": 10}, "whole"),
    ("most partial images", "/v1/images/generations", AUTH, {**_IMAGE, "stream": True, "partial_images": 3}, "whole"),
    ("most candidates", CONTENT, {}, _content(maxOutputTokens=800, candidateCount=8), "whole"),
    ("most videos", "/v1/video/generations", AUTH, _VIDEO, "whole"),
    ("most videos, SDK shape", "/v1/videos", AUTH, {**_VIDEO, "seconds": "8"}, "whole"),
    (
        "no usage: messages",
        "/v1/messages",
        {**MSG, "x-sim-no-usage": "1"},
        _message(max_tokens=800, stream=True),
        "whole",
    ),
    ("no usage: content", CONTENT_STREAM, {"x-sim-no-usage": "1"}, _content(maxOutputTokens=800), "whole"),
    (
        "no usage: responses",
        "/v1/responses",
        {**AUTH, "x-sim-no-usage": "1"},
        _response(max_output_tokens=800, stream=True),
        "whole",
    ),
    ("no usage: images", "/v1/images/generations", {**AUTH, "x-sim-no-usage": "1"}, _IMAGE, "whole"),
]


async def _one(
    http: aiohttp.ClientSession, url: str, key: str, path: str, headers: dict[str, str], body: dict[str, Any], how: str
) -> tuple[int, Any]:
    from proxy.core import jsonutil

    headers = {
        name: value.replace(KEY, key)
        for name, value in {**headers, "content-type": "application/json", "x-sim-output-tokens": "600"}.items()
    }
    if how == "before_head":
        headers["x-sim-latency-ms"] = "3000"
    if how == "mid_stream":
        headers["x-sim-chunk-delay-ms"] = "10"
    try:
        # Gone before the head, yet after the gateway has taken the request: 0.3 s was too soon
        # on a loaded machine (twenty at once, in the test's own loop), and a request dropped before
        # its handler ran is in no ledger (the case failed once so, with 8 rows of 20).
        async with asyncio.timeout(1.0 if how == "before_head" else 30):
            async with http.post(url + path.replace(KEY, key), data=jsonutil.dumps(body), headers=headers) as answer:
                if how == "mid_stream" and answer.status == 200:
                    for _ in range(5):
                        await answer.content.readuntil(b"data:")
                    return answer.status, None
                raw = await answer.read()
                return answer.status, jsonutil.loads(raw) if raw.startswith(b"{") else raw
    except TimeoutError:
        return 499, None


def _reserved(refusal: Any) -> int:
    """What a request reserved, as its budget refusal says it."""
    message = str(refusal)
    for mark in ("may spend (", "may spend up to "):
        if mark in message:
            return int(float(message.split(mark)[1].split(")")[0].split(" ")[0]))
    raise AssertionError(f"a refusal that names no reservation: {message}")


async def test_a_sweep_of_every_way_to_slip_past_a_10000_token_budget(
    ledger_db, redis_url, start_gateway, http, tmp_path
) -> None:
    """Each case with a key of its own and a budget of 10,000 tokens a day, 20 requests at once:
    what the upstream made passes the budget by at most one request's reservation, what is
    charged likewise, and the ledger's sum is the budget counter, exactly."""
    keys = ", ".join(f"{{name: k{i}, key: {KEY}-{i}, budget: {{tokens_per_day: {BUDGET}}}}}" for i in range(len(SWEEP)))
    gateway = await start_gateway(
        metered(
            redis_url, ledger_db, str(tmp_path / "spool"), f"[{keys}]", "{default_reserve_tokens: 1000}", SWEEP_PRICES
        )
    )
    sim = gateway.sim()
    made: dict[str, list[Any]] = {}
    for index, (case, path, headers, body, how) in enumerate(SWEEP):
        before = sim.produced["input_tokens"] + sim.produced["output_tokens"]
        answers = await asyncio.gather(
            *(_one(http, gateway.url, f"{KEY}-{index}", path, headers, body, how) for _ in range(20))
        )
        made[case] = [a for status, a in answers if status == 200 and isinstance(a, dict)]
        produced = sim.produced["input_tokens"] + sim.produced["output_tokens"] - before
        # A request whose client left is settled once the gateway sees it go: `agreed` waits for it.
        charged, found = await agreed(redis_url, ledger_db, 20, name=f"k{index}")
        most = max([_reserved(a) for status, a in answers if status == 429], default=0)  # one request's reservation
        assert produced <= BUDGET + most and charged <= BUDGET + most, (case, produced, charged, most)
        assert len(found) == 20 and not [r for r in found if r["status"] >= 500], (case, found)

    # Follow-ups read what was made, whatever is left of the budget: never refused by it.
    task_ids = [a["task_id"] for a in made["most videos"]] + [a["id"] for a in made["most videos, SDK shape"]]
    response_ids = [a["id"] for a in made["background"]]
    assert task_ids and response_ids
    key = {"Authorization": f"Bearer {KEY}-0"}
    video_key = {"Authorization": f"Bearer {KEY}-{[c[0] for c in SWEEP].index('most videos')}"}
    follow_ups = [("GET", f"/v1/video/generations/{t}", video_key) for t in task_ids[:5]]
    follow_ups += [("GET", f"/v1/videos/{t}/content", video_key) for t in task_ids[:5]]
    follow_ups += [("GET", "/v1/videos", video_key), ("GET", "/v1/models", key)]
    follow_ups += [("GET", f"/v1/responses/{r}", key) for r in response_ids]
    follow_ups += [("GET", f"/v1/responses/{r}/input_items", key) for r in response_ids]
    follow_ups += [("POST", f"/v1/responses/{r}/cancel", key) for r in response_ids]
    statuses = []
    for method, path, headers in follow_ups:
        async with http.request(method, gateway.url + path, headers=headers) as answer:
            await answer.read()
            statuses.append(answer.status)
    assert set(statuses) == {200}, list(zip(follow_ups, statuses))
    charged, found = await agreed(redis_url, ledger_db, 20, name="k0")
    assert not any(r["pending"] for r in found if r["route"] == "responses")  # each read back, and settled


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of the test's own, to stop (SIGSTOP) and resume: (its URL, its process)."""
    import subprocess

    from tests.conftest import free_port

    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    yield f"redis://127.0.0.1:{port}/0", redis
    redis.terminate()
    redis.wait(timeout=10)


async def test_spending_served_while_the_state_store_was_away_is_counted_once_it_is_back(
    ledger_db, start_gateway, http, tmp_path, own_redis
) -> None:
    import signal as signals

    url, redis = own_redis
    keys = f"[{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]"
    # The default wait: the probe has seen the store go before the requests below arrive.
    gateway = await start_gateway(metered(url, ledger_db, str(tmp_path / "spool"), keys, check_timeout_s=0.5))
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 900, "messages": [{"role": "user", "content": "hi"}]}
    assert (await post(http, gateway.url + "/v1/messages", body, {**MSG, "x-sim-output-tokens": "500"}))[0] == 200
    redis.send_signal(signals.SIGSTOP)  # away: budgets fail open (the default), and serve
    try:
        await asyncio.sleep(2.5)  # the store's probe has seen it go: no request waits on it
        served = await asyncio.gather(
            *(post(http, gateway.url + "/v1/messages", body, {**MSG, "x-sim-output-tokens": "500"}) for _ in range(3))
        )
        assert [status for status, _ in served] == [200] * 3
    finally:
        redis.send_signal(signals.SIGCONT)
    held, found = await agreed(url, ledger_db, 4, within_s=20)
    assert held == 4 * (500 + 1)  # the three served unchecked are in the counter too


async def test_a_reservation_that_never_reached_the_store_is_counted_once_it_is_back(
    ledger_db, start_gateway, http, tmp_path, own_redis
) -> None:
    """The store stalls before its probe notices: a reservation waiting for a new connection (whose
    handshake the stalled store never answers) times out unsent, so it never ran, and what its
    request spends is counted once the store is back."""
    import signal as signals

    import redis.asyncio as aioredis

    url, redis = own_redis
    keys = f"[{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]"
    gateway = await start_gateway(metered(url, ledger_db, str(tmp_path / "spool"), keys, check_timeout_s=0.2))
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 900, "messages": [{"role": "user", "content": "hi"}]}
    assert (await post(http, gateway.url + "/v1/messages", body, {**MSG, "x-sim-output-tokens": "500"}))[0] == 200
    client = aioredis.Redis.from_url(url)
    try:
        await client.client_kill_filter(_type="normal", skipme=True)  # the gateway's kept connections go
    finally:
        await client.aclose()
    redis.send_signal(signals.SIGSTOP)
    try:
        served = await asyncio.gather(
            *(post(http, gateway.url + "/v1/messages", body, {**MSG, "x-sim-output-tokens": "500"}) for _ in range(3))
        )
        assert [status for status, _ in served] == [200] * 3  # failing open
    finally:
        redis.send_signal(signals.SIGCONT)
    held, found = await agreed(url, ledger_db, 4, within_s=20)
    assert held == 4 * (500 + 1)  # neither lost nor counted twice
