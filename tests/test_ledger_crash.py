"""No record lost to a crash: with Redis state, a request's record is journaled in Redis before its
client's answer ends, so a gateway killed with SIGKILL loses none; another instance's writer
writes what it left (plugins/ledger/journal.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

import aiohttp

from tests.test_ledger import MIXED, ledger_config, rows, rows_when


async def test_a_gateway_killed_mid_run_loses_no_record_and_none_is_written_twice(
    ledger_db, spawn, redis_url, tmp_path
) -> None:
    """Two instances sharing Redis state and the ledger under mixed load (every chat format as JSON
    and stream, images, videos), each request with an X-Request-Id of its own; one is killed with
    SIGKILL while requests are in flight, and the run finishes on the other (a client whose answer
    was cut sends it again there, under a new id). Then every answer a client received whole has
    exactly one row, no id has two, and the only rows of answers no client received are of
    requests in flight at the kill."""
    import redis.asyncio as aioredis

    sim = spawn(
        "simulator",
        "--chunk-delay-ms",
        "3",
        "--output-tokens",
        "6",
        "--video-queued-s",
        "0",
        "--video-processing-s",
        "0",
    )
    prefix = f"crash-{tmp_path.name}:"
    # A fixed bound on requests in flight: the survivor takes the victim's load and its clients'
    # resends at once, which `auto` may answer in part with 503 on a busy machine; the records, not
    # admission, are under test here.
    text = ledger_config(
        ledger_db,
        str(tmp_path / "spool"),
        flush_s=0.2,
        extra=f"""
server: {{listen: "127.0.0.1:{{PORT}}", workers: 1, max_in_flight: 10000}}
state: {{backend: redis, url: "{redis_url}", prefix: "{prefix}"}}
""",
        channel=f'{{name: simulator, base_url: "{sim.url}"}}',
    ).replace("flush_interval_s: 0.2,", "flush_interval_s: 0.2, write_timeout_s: 1,")
    victim, survivor = spawn("gateway", config=text), spawn("gateway", config=text)
    total, kill_after = 2400, 900
    received: dict[str, int] = {}  # X-Request-Id -> status, of the answers clients had whole
    attempts: dict[str, float] = {}  # X-Request-Id -> when it was sent
    failed: set[str] = set()  # attempts whose answer never came whole
    killed_at: float | None = None
    gate = asyncio.Semaphore(32)

    async def attempt(http: aiohttp.ClientSession, url: str, request_id: str, case: int) -> bool:
        path, headers, body = MIXED[case]
        attempts[request_id] = time.monotonic()
        try:
            async with http.post(url + path, headers={**headers, "X-Request-Id": request_id}, json=body) as answer:
                await answer.read()  # a stream cut short, or a body short of its length, raises here
                received[request_id] = answer.status
                return True
        except (TimeoutError, aiohttp.ClientError):
            failed.add(request_id)
            return False

    async def one(http: aiohttp.ClientSession, index: int) -> None:
        async with gate:
            # Turn about by rounds of MIXED, so each instance serves every kind of request.
            first = victim if (index // len(MIXED)) % 2 and killed_at is None else survivor
            if not await attempt(http, first.url, f"crash-{index}", index % len(MIXED)):
                assert first is victim, f"crash-{index} failed on the survivor"
                await attempt(http, survivor.url, f"crash-{index}-again", index % len(MIXED))

    async def kill() -> None:
        nonlocal killed_at
        while len(received) < kill_after:
            await asyncio.sleep(0.005)
        killed_at = time.monotonic()
        victim.proc.kill()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        await asyncio.gather(kill(), *(one(http, i) for i in range(total)))
    assert killed_at is not None and victim.proc.wait(timeout=5) == -9
    in_flight = {rid for rid in failed if attempts[rid] < killed_at}
    assert in_flight, "some requests were in flight at the kill"
    assert len(received) == total and set(received.values()) == {200}

    # Every answer received has its row: those the victim had journaled are written by the
    # survivor once they are orphans (older than 2 * (flush + write timeout) + 2 s: 4.4 s).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = await rows(ledger_db)
        if set(received) <= {r["client_request_id"] for r in found}:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(6)  # any orphan left would be written by now, and a second write would show
    found = await rows(ledger_db)
    ids = [r["client_request_id"] for r in found]
    assert len(ids) == len(set(ids)), "a request has two rows"
    assert set(received) <= set(ids), f"answers received without a row: {sorted(set(received) - set(ids))[:10]}"
    # The rest are requests that were in flight at the kill: they reached the upstream, which
    # answered them whole (a record is journaled only in a request's bookkeeping, after its
    # answer), but the victim died before the client had the end of that answer.
    unreceived = set(ids) - set(received)
    assert unreceived <= in_flight, sorted(unreceived - in_flight)[:10]
    assert all(
        r["status"] == 200 and r["channel"] == "simulator" for r in found if r["client_request_id"] in unreceived
    )
    store = aioredis.Redis.from_url(redis_url)
    try:
        assert await store.xlen(prefix + "ledger:journal") == 0  # every entry written, then removed
    finally:
        await store.aclose()


def counted(outcome: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("modelgate_ledger_records_total", {"outcome": outcome}) or 0.0


def record(index: int) -> Any:
    from plugins.ledger.record import UsageRecord

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
        200,
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


async def test_journaled_records_postgresql_did_not_take_are_written_by_another_writer_once(
    ledger_db, redis_url, tmp_path
) -> None:
    """A writer whose PostgreSQL is away drops its journaled records from memory (they wait in the
    journal) and spools only the one the journal did not take; another instance's writer writes
    the journaled ones as orphans, once, and removes their entries."""
    from plugins.ledger.journal import Journal
    from plugins.ledger.spool import FileSpool
    from plugins.ledger.writer import LedgerWriter
    from proxy.state.shared import share

    key = f"test-{tmp_path.name}:ledger:journal"
    away = LedgerWriter(
        "postgresql://postgres@127.0.0.1:1/nowhere",
        100,
        0.05,
        [FileSpool(tmp_path / "away", 1 << 20)],
        0.5,
        Journal(share(redis_url), key, 1 << 20, 1.0),
    )
    for index in range(5):
        await away.journaled(record(index))
    assert away.journal is not None
    away.journal.full = True  # at the bound: not journaled, so in this memory alone
    await away.journaled(record(5))
    await away.start()
    deadline = time.monotonic() + 10
    while away.waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await away.close()
    spooled = (tmp_path / "away").glob("*.jsonl")
    assert [line.count(b'"request_id"') for line in (p.read_bytes() for p in spooled)] == [1]
    assert b'"r5"' in b"".join(p.read_bytes() for p in (tmp_path / "away").glob("*.jsonl"))

    written = counted("written")
    other = LedgerWriter(
        ledger_db,
        100,
        0.05,
        [FileSpool(tmp_path / "other", 1 << 20)],
        0.5,
        Journal(share(redis_url), key, 1 << 20, 1.0),
    )
    await other.start()
    found = await rows_when(ledger_db, 5)
    await asyncio.sleep(1.5)  # a second write of any of them would come in this time
    await other.close()
    assert sorted(r["request_id"] for r in found) == [f"r{i}" for i in range(5)]
    assert counted("written") - written == 5  # once each
    store = share(redis_url)
    try:
        assert await store.client.xlen(key) == 0
    finally:
        from proxy.state.shared import unshare

        await unshare(store)


async def test_a_record_the_journal_cannot_take_goes_the_old_way(ledger_db, tmp_path) -> None:
    """Redis away: the append fails within its bound, the request goes on, and the record waits in
    memory to be written (or spooled) as before."""
    from plugins.ledger.journal import WAIT_S, Journal
    from plugins.ledger.spool import FileSpool
    from plugins.ledger.writer import LedgerWriter
    from proxy.state.shared import share

    unjournaled = counted("unjournaled")
    writer = LedgerWriter(
        ledger_db,
        100,
        0.05,
        [FileSpool(tmp_path / "spool", 1 << 20)],
        0.5,
        Journal(share("redis://127.0.0.1:1/0"), "nowhere:ledger:journal", 1 << 20, 1.0),
    )
    started = time.monotonic()
    await writer.journaled(record(1))
    assert time.monotonic() - started < WAIT_S + 0.5
    assert counted("unjournaled") - unjournaled == 1
    await writer.start()
    [row] = await rows_when(ledger_db, 1)
    await writer.close()
    assert row["request_id"] == "r1"


async def test_a_record_postgresql_refuses_is_set_aside_and_the_rest_of_its_batch_written(ledger_db, tmp_path) -> None:
    """One record PostgreSQL cannot take (a count past its column, a NUL in a text) fails its whole
    batch, which is split until that record stands alone. (A count past any column is bounded
    when the record is made: record_of.)"""
    import dataclasses

    import asyncpg

    from plugins.ledger.spool import FileSpool
    from plugins.ledger.writer import LedgerWriter

    batch = [record(n) for n in range(6)]
    batch[1] = dataclasses.replace(batch[1], input_tokens=2**63 + 5)  # past a bigint column
    batch[4] = dataclasses.replace(batch[4], model="m\x00m")
    batch.append(dataclasses.replace(record(0), cost=0.1234567891234))  # cost kept to billionths
    refused, spooled = counted("refused"), counted("spooled")
    writer = LedgerWriter(ledger_db, 100, 0.05, [FileSpool(tmp_path / "spool", 1 << 20)], 0.5)
    await writer.start()
    for each in batch:
        writer.submit(each)
    await rows_when(ledger_db, 4)
    await writer.close()
    assert counted("refused") - refused == 2 and counted("spooled") == spooled  # refused records are not spooled
    connection = await asyncpg.connect(ledger_db)
    try:
        found = {
            row["request_id"]: row["cost"]
            for row in await connection.fetch("SELECT request_id, cost FROM usage_records")
        }
    finally:
        await connection.close()
    assert sorted(found) == ["r0", "r2", "r3", "r5"]
    from decimal import Decimal

    assert found["r0"] in (Decimal(0), Decimal("0.123456789"))  # r0 and its repeat: one row; to billionths
