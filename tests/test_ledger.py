"""The usage ledger: one row per answered request in PostgreSQL, with the upstream's own counts,
priced by the table; written while PostgreSQL comes and goes, never twice."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import BEARER

MSG = {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"}
PRICES = """
prices:
  - {model: "msgmodel-*", input_per_mtok: 3, output_per_mtok: 15}
  - {model: "respmodel-*", input_per_mtok: 2.5, cached_input_per_mtok: 1.25, output_per_mtok: 10}
  - {model: "imagegen-*", per_image: 0.04, per_image_by: {"1024x1024/high": 0.17}}
  - {model: "videogen-*", per_video_second: 0.5}
"""


IN_PROCESS = """{name: simulator, base_url: simulator, simulator: {chunk_delay_ms: 0, output_tokens: 12,
             video_queued_s: 0, video_processing_s: 0}}"""


def ledger_config(
    database_url: str, spool_dir: str, extra: str = "", flush_s: float = 0.1, channel: str = IN_PROCESS
) -> str:
    return f"""
channels: [{channel}]
observability: {{logging: {{access_log: false}}}}
plugins: {{ledger: {{database_url: "{database_url}", flush_interval_s: {flush_s}, spool_dir: "{spool_dir}"}}}}
{PRICES}
{extra}
"""


async def rows(database_url: str, query: str = "SELECT * FROM usage_records ORDER BY at") -> list[Any]:
    import asyncpg

    connection = await asyncpg.connect(database_url)
    try:
        return list(await connection.fetch(query))
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await connection.close()


async def rows_when(database_url: str, count: int, within_s: float = 15.0) -> list[Any]:
    """The ledger's rows once there are `count` of them (or what there is after `within_s`)."""
    deadline = time.monotonic() + within_s
    found: list[Any] = []
    while time.monotonic() < deadline:
        found = await rows(database_url)
        if len(found) >= count:
            return found
        await asyncio.sleep(0.1)
    return found


MIXED: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    (
        "/v1/messages",
        MSG,
        {"model": "msgmodel-haiku-4-5", "max_tokens": 50, "messages": [{"role": "user", "content": "one two three"}]},
    ),
    (
        "/v1/messages",
        MSG,
        {
            "model": "msgmodel-haiku-4-5",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "four five"}],
        },
    ),
    (
        "/v1beta/models/genmodel-2.0-flash:generateContent?key=sk-demo-key",
        {},
        {"contents": [{"parts": [{"text": "six seven eight"}]}]},
    ),
    (
        "/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key=sk-demo-key",
        {},
        {"contents": [{"parts": [{"text": "nine"}]}]},
    ),
    ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "ten eleven"}),
    ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "twelve", "stream": True}),
    (
        "/v1/images/generations",
        BEARER,
        {"model": "imagegen-1", "prompt": "a cat", "n": 2, "size": "1024x1024", "quality": "high"},
    ),
    (
        "/v1/video/generations",
        BEARER,
        {"model": "videogen-3.0-generate-001", "prompt": "waves", "metadata": {"durationSeconds": 8}},
    ),
]


async def send_mixed(http: aiohttp.ClientSession, url: str, times: int = 1) -> list[int]:
    async def one(path: str, headers: dict[str, str], body: dict[str, Any]) -> int:
        async with http.post(url + path, headers=headers, json=body) as answer:
            await answer.read()
            return answer.status

    return list(await asyncio.gather(*(one(*case) for _ in range(times) for case in MIXED)))


async def test_every_answered_request_has_one_row_whose_tokens_are_what_the_upstream_reported(
    ledger_db, start_gateway, http, tmp_path
) -> None:
    gateway = await start_gateway(ledger_config(ledger_db, str(tmp_path / "spool")))
    statuses = await send_mixed(http, gateway.url, times=3)
    assert statuses == [200] * len(statuses)
    found = await rows_when(ledger_db, len(statuses))
    assert len(found) == len(statuses) and len({r["request_id"] for r in found}) == len(statuses)
    reported = gateway.sim().reported
    chat = [r for r in found if r["route"] != "video_generations"]
    assert sum(r["input_tokens"] for r in chat) == reported["input_tokens"]
    assert sum(r["output_tokens"] for r in chat) == reported["output_tokens"]
    assert all(r["key_name"] == "demo" and r["status"] == 200 and r["channel"] == "simulator" for r in found)
    assert not any(r["estimated"] or r["client_aborted"] for r in found)
    images = [r for r in found if r["route"] == "image_generations"]
    assert [(r["images"], float(r["cost"])) for r in images] == [(2, 0.34)] * 3  # two at 1024x1024/high
    video = [r for r in found if r["route"] == "video_generations"]
    assert [(r["video_seconds"], float(r["cost"]), r["priced"]) for r in video] == [(8.0, 4.0, True)] * 3
    message = next(r for r in found if r["route"] == "messages")
    assert float(message["cost"]) == pytest.approx((message["input_tokens"] * 3 + message["output_tokens"] * 15) / 1e6)
    content = [r for r in found if r["route"].endswith("generate_content")]
    assert content and all(not r["priced"] and float(r["cost"]) == 0 for r in content)  # no row prices genmodel


async def test_a_client_that_leaves_a_stream_early_still_has_its_row_its_figures_estimated(
    ledger_db, start_gateway, http, tmp_path
) -> None:
    gateway = await start_gateway(ledger_config(ledger_db, str(tmp_path / "spool")))
    slow = {**MSG, "x-sim-chunk-delay-ms": "50", "x-sim-output-tokens": "200"}
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 500,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    }
    answer = await http.post(gateway.url + "/v1/messages", headers=slow, json=body)
    await answer.content.readuntil(b"content_block_delta")
    await answer.content.readuntil(b"content_block_delta")
    answer.close()  # gone, long before the upstream said how much it made
    [row] = await rows_when(ledger_db, 1)
    assert row["client_aborted"] and row["estimated"]
    assert row["input_tokens"] > 0 and 1 <= row["output_tokens"] < 200


async def test_records_made_while_postgresql_is_away_arrive_once_it_returns_none_twice(
    ledger_db, start_gateway, http, tmp_path
) -> None:
    from tests.tcp_relay import SwitchedRelay

    relay = SwitchedRelay(int(ledger_db.split(":")[-1].split("/")[0]))
    await relay.up()
    through_relay = ledger_db.replace(":5432/", f":{relay.port}/")
    gateway = await start_gateway(ledger_config(through_relay, str(tmp_path / "spool")))
    before = await send_mixed(http, gateway.url)
    await rows_when(ledger_db, len(before))

    async def spooled() -> float:  # the process's counter: other tests in this process count there too
        async with http.get(gateway.admin + "/metrics") as answer:
            found = re.search(r'modelgate_ledger_records_total\{outcome="spooled"\} (\S+)', await answer.text())
        assert found is not None
        return float(found[1])

    spooled_before = await spooled()
    await relay.down()
    during = await send_mixed(http, gateway.url, times=4)
    await asyncio.sleep(1.5)  # batches fail and are spooled
    assert len(await rows(ledger_db)) == len(before)
    assert await spooled() - spooled_before == len(during)
    await relay.up()
    after = await send_mixed(http, gateway.url)
    answered = before + during + after
    assert answered == [200] * len(answered)
    found = await rows_when(ledger_db, len(answered))
    assert len(found) == len(answered) and len({r["request_id"] for r in found}) == len(answered)
    await relay.down()


async def test_sigterm_writes_what_is_waiting_before_the_process_ends(ledger_db, spawn, tmp_path) -> None:
    gateway = spawn(
        "gateway",
        config=ledger_config(
            ledger_db, str(tmp_path / "spool"), flush_s=60, extra='server: {listen: "127.0.0.1:{PORT}"}'
        ),
    )
    async with aiohttp.ClientSession() as http:
        statuses = await send_mixed(http, gateway.url, times=2)
    assert await rows(ledger_db) == [] or len(await rows(ledger_db)) < len(statuses)  # waiting for the next flush
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(timeout=30) == 0
    assert len(await rows(ledger_db)) == len(statuses)


async def test_instances_starting_together_migrate_the_schema_once(ledger_db) -> None:
    import asyncpg

    from plugins.ledger.schema import MIGRATIONS, migrate

    connections = [await asyncpg.connect(ledger_db) for _ in range(3)]
    try:
        assert await asyncio.gather(*(migrate(c) for c in connections)) == [len(MIGRATIONS)] * 3
        versions = await connections[0].fetch("SELECT version FROM modelgate_ledger_schema")
        assert [v["version"] for v in versions] == list(range(1, len(MIGRATIONS) + 1))
    finally:
        for connection in connections:
            await connection.close()


async def test_the_report_sums_the_ledger_by_what_it_is_asked_and_metrics_count_the_cost(
    ledger_db, start_gateway, http, tmp_path
) -> None:
    import csv
    import subprocess
    import sys
    from pathlib import Path

    config = ledger_config(ledger_db, str(tmp_path / "spool"))
    gateway = await start_gateway(config)

    async def cost_counted() -> float:  # this process's counters: other tests' gateways count there too
        async with http.get(gateway.admin + "/metrics") as answer:
            metrics = await answer.text()
        return sum(float(v) for v in re.findall(r'modelgate_cost_total\{key="demo",model="[^"]+"\} (\S+)', metrics))

    before = await cost_counted()
    statuses = await send_mixed(http, gateway.url, times=2)
    found = await rows_when(ledger_db, len(statuses))
    (tmp_path / "gateway.yaml").write_text(config)

    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "proxy", "usage", "report", "-c", str(tmp_path / "gateway.yaml"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parent.parent,
        )

    made = report("--since", "1h", "--by", "route,model", "--format", "csv")
    assert made.returncode == 0, made.stderr
    table = list(csv.DictReader(made.stdout.splitlines()))
    assert sum(int(r["requests"]) for r in table) == len(found)
    assert sum(int(r["output_tokens"]) for r in table) == sum(r["output_tokens"] or 0 for r in found)
    images = next(r for r in table if r["route"] == "image_generations")
    assert (int(images["requests"]), int(images["images"]), float(images["cost"])) == (2, 4, pytest.approx(0.68))
    assert report("--since", "1h", "--by", "key").stdout.splitlines()[0].split()[:2] == ["key", "requests"]
    assert report("--since", "yesterday").returncode == 2 and report("--by", "key;drop").returncode == 2
    assert report("--since", "2h", "--until", "2020-01-01").returncode == 2  # a span that ends before it starts
    # The video tasks nobody polled are pending at what is held for them: counted once settled.
    assert {r["route"] for r in found if r["pending"]} == {"video_generations"}
    assert sum(int(r["pending"]) for r in table) == 2
    assert await cost_counted() - before == pytest.approx(sum(float(r["cost"]) for r in found if not r["pending"]))


async def test_ten_thousand_requests_through_three_instances_with_postgresql_away_for_30_s(
    ledger_db, spawn, redis_url, tmp_path
) -> None:
    """Every chat format as JSON and stream, images and videos, some streams left early, through
    three instances sharing Redis; PostgreSQL unreachable for 30 s in the middle. The ledger ends
    with exactly one row per answered request, and its token sums are what the upstream reported."""
    from tests.tcp_relay import SwitchedRelay

    sim = spawn(
        "simulator",
        "--chunk-delay-ms",
        "0",
        "--output-tokens",
        "6",
        "--video-queued-s",
        "0",
        "--video-processing-s",
        "0",
    )
    relay = SwitchedRelay(int(ledger_db.split(":")[-1].split("/")[0]))
    await relay.up()
    through_relay = ledger_db.replace(":5432/", f":{relay.port}/")
    text = ledger_config(
        through_relay,
        str(tmp_path / "spool"),
        flush_s=0.2,
        extra=f"""
server: {{listen: "127.0.0.1:{{PORT}}"}}
state: {{backend: redis, url: "{redis_url}", prefix: "ledger-{tmp_path.name}:"}}
""",
        channel=f'{{name: simulator, base_url: "{sim.url}"}}',
    )
    gateways = [spawn("gateway", config=text) for _ in range(3)]
    gate = asyncio.Semaphore(32)
    answered = 0

    async def one(http: aiohttp.ClientSession, index: int) -> None:
        nonlocal answered
        path, headers, body = MIXED[index % len(MIXED)]
        async with gate, http.post(gateways[index % 3].url + path, headers=headers, json=body) as answer:
            await answer.read()
            answered += answer.status == 200

    async def leave_early(http: aiohttp.ClientSession, url: str) -> None:
        slow = {**MSG, "x-sim-chunk-delay-ms": "20", "x-sim-output-tokens": "50"}
        async with gate:
            answer = await http.post(url + "/v1/messages", headers=slow, json={**MIXED[1][2], "max_tokens": 60})
            await answer.content.readuntil(b"content_block_delta")
            answer.close()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        await asyncio.gather(*(one(http, i) for i in range(3000)))
        await relay.down()
        away = time.monotonic()
        requests = [one(http, i) for i in range(3000, 10_000)]
        requests += [leave_early(http, gateways[i % 3].url) for i in range(30)]
        await asyncio.gather(*requests)
        await asyncio.sleep(max(0.0, 30 - (time.monotonic() - away)))
        await relay.up()
        found = await rows_when(ledger_db, answered + 30, within_s=60)
    await relay.down()
    assert answered == 10_000
    assert len(found) == answered + 30 and len({r["request_id"] for r in found}) == len(found)
    left = [r for r in found if r["client_aborted"]]
    assert len(left) == 30 and all(r["estimated"] and r["status"] == 200 for r in left)
    async with aiohttp.ClientSession() as http, http.get(sim.url + "/_sim/stats") as answer:
        reported = (await answer.json())["reported"]
    whole = [r for r in found if not r["client_aborted"] and r["route"] != "video_generations"]
    assert reported["answers"] == len(whole)
    assert sum(r["input_tokens"] for r in whole) == reported["input_tokens"]
    assert sum(r["output_tokens"] for r in whole) == reported["output_tokens"]


async def test_a_request_without_a_key_has_no_row_and_a_refused_model_name_is_kept_short(
    ledger_db, start_gateway, http, tmp_path
) -> None:
    gateway = await start_gateway(ledger_config(ledger_db, str(tmp_path / "spool")))
    long_model = {**MIXED[0][2], "model": "m" * 100_000}
    async with http.post(gateway.url + "/v1/messages", json=long_model, headers={"msgapi-version": "2023-06-01"}) as a:
        assert a.status == 401  # nobody's to pay for: no row
    async with http.post(gateway.url + "/v1/messages", json=long_model, headers=MSG) as answer:
        assert answer.status == 400
    [row] = await rows_when(ledger_db, 1)
    assert row["status"] == 400 and len(row["model"]) == 256


async def test_a_record_postgresql_refuses_is_set_aside_and_the_others_of_its_batch_are_written(
    ledger_db, tmp_path
) -> None:
    from datetime import datetime, timezone

    from plugins.ledger.record import UsageRecord
    from plugins.ledger.spool import FileSpool
    from plugins.ledger.writer import LedgerWriter

    def record(index: int, status: int = 200) -> UsageRecord:
        return UsageRecord(
            f"r{index}",
            datetime.now(timezone.utc),
            None,
            "k",
            "key:k",
            "messages",
            "m",
            "m",
            "c",
            status,
            1,
            0,
            1,
            0,
            0,
            0.0,
            0.0,
            False,
            1.0,
            False,
            False,
        )

    writer = LedgerWriter(ledger_db, 100, 0.05, [FileSpool(tmp_path / "spool", 1 << 20)])
    await writer.start()
    for index in range(10):
        writer.submit(record(index, status=2**40 if index == 4 else 200))  # no integer column holds it
    found = await rows_when(ledger_db, 9)
    for index in range(10, 15):  # and PostgreSQL was never taken for away: later records go straight in
        writer.submit(record(index))
    found = await rows_when(ledger_db, 14)
    await writer.close()
    assert sorted(r["request_id"] for r in found) == sorted(f"r{i}" for i in range(15) if i != 4)
    assert not list((tmp_path / "spool").glob("*.jsonl")), "nothing was spooled"


async def test_video_forms_and_streamed_images_are_counted(ledger_db, start_gateway, http, tmp_path) -> None:
    gateway = await start_gateway(ledger_config(ledger_db, str(tmp_path / "spool")))
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in (("model", "videogen-3.0-generate-001"), ("prompt", "waves"), ("seconds", "6")):
        form.add_field(name, value)
    async with http.post(gateway.url + "/v1/videos", data=form, headers=BEARER) as answer:
        assert answer.status == 200
    streamed = {"model": "imagegen-1", "prompt": "a cat", "stream": True, "size": "1024x1024", "quality": "high"}
    async with http.post(gateway.url + "/v1/images/generations", json=streamed, headers=BEARER) as answer:
        assert answer.status == 200 and b".completed" in await answer.read()
    found = {r["route"]: r for r in await rows_when(ledger_db, 2)}
    assert (found["videos"]["video_seconds"], float(found["videos"]["cost"])) == (6.0, 3.0)
    assert (found["image_generations"]["images"], float(found["image_generations"]["cost"])) == (1, 0.17)


def test_the_report_s_table_prints_no_character_that_steers_a_terminal() -> None:
    import io

    from plugins.ledger.report import SUMS, write

    out = io.StringIO()
    write([{"model": "msg\x9b2Jmodel", **dict.fromkeys(SUMS, 0)}], ["model"], "table", out)
    assert "\x9b" not in out.getvalue() and "msg\\x9b2Jmodel" in out.getvalue()
