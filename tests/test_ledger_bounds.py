"""The ledger's streams in Redis (the journal and the spool) hold at most `spool_max_mb` in bytes
as written: a record's size varies (a long model name, a client's request id), so a bound counted
in records at an assumed size let two and a half times as much in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from proxy.state.stream_bytes import beside
from tests.test_ledger import MSG, ledger_config
from tests.test_ledger_crash import counted

NOWHERE = "postgresql://postgres@127.0.0.1:1/nowhere"  # PostgreSQL away: what waits, waits in Redis


def record(index: int, filler: int = 0) -> Any:
    """A usage record; `filler` characters more in its names (model and upstream model up to their
    256, the client's request id up to its 128, the rest in the key's name and tenant label): at
    `filler=1670` it is about 2.5 KB as written."""
    from plugins.ledger.record import UsageRecord

    model, client_id = min(filler, 240), min(filler, 128)
    rest = max(0, filler - model - client_id) // 2
    return UsageRecord(
        f"r{index:04d}",
        datetime.now(timezone.utc),
        "c" * client_id,
        "k" * (1 + rest),
        "tenant:" + "t" * rest,
        "messages",
        "msgmodel-" + "m" * model,
        "up-" + "m" * model,
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


async def stream_bytes(client: Any, key: str) -> int:
    """What the stream's entries hold, field names and values, read back entry by entry."""
    return sum(sum(len(k) + len(v) for k, v in fields.items()) for _, fields in await client.xrange(key))


async def test_the_journal_takes_records_to_its_bytes_and_no_further(shared_redis: str) -> None:
    """On every topology (on a Cluster the counter shares its stream's slot)."""
    from plugins.ledger.journal import Journal
    from proxy.state.shared import share

    key = "bounds:ledger:journal"
    journal = Journal(share(shared_redis), key, 20_000, 60.0)
    client = journal._shared.client
    try:
        big = record(0, filler=1670)
        assert 2400 < len(big.encoded()) < 2600
        # Warm: the client's connections (a Cluster's map of slots) and the script, which a first
        # call makes within the append's half-second wait only on an idle machine; then emptied.
        assert await journal.append(record(99)) is not None
        await client.delete(key, beside(key))
        journaled, unjournaled = counted("journaled"), counted("unjournaled")
        entries = await asyncio.gather(*(journal.append(record(n, filler=1670)) for n in range(12)))
        taken = [entry for entry in entries if entry is not None]
        # 8, each counted as it was written; counted at 1 KB a record, 19 went in, 47 KB.
        assert len(taken) == 20_000 // (6 + len(big.encoded())) == 8
        assert counted("journaled") - journaled == 8 and counted("unjournaled") - unjournaled == 4
        held = await stream_bytes(client, key)
        assert held <= 20_000 and int(await client.get(beside(key))) == held
        assert journal.full  # the next records are not even sent
        assert await journal.append(record(99)) is None

        # Small records fit where big ones did not, once the writer sees room again.
        await journal.remove(taken[:3])
        assert int(await client.get(beside(key))) == await stream_bytes(client, key)
        await journal.measure()
        assert not journal.full
        assert await journal.append(record(100)) is not None
        await journal.remove([entry_id for entry_id, _ in await client.xrange(key)])
        await journal.measure()
        assert await client.get(beside(key)) == b"0" and await client.xlen(key) == 0
    finally:
        await journal.close()


async def test_the_redis_spool_takes_batches_to_its_bytes(shared_redis: str) -> None:
    from plugins.ledger.spool import RedisSpool
    from proxy.state.shared import share

    key = "bounds:ledger:spool"
    spool = RedisSpool(share(shared_redis), key, 12_000)
    client = spool._client
    try:
        batch = [record(n, filler=1670) for n in range(2)]  # about 5 KB as written
        assert [await spool.put(batch) for _ in range(3)] == [True, True, False]
        assert await spool.held() == await stream_bytes(client, key) <= 12_000
        assert await spool.put([record(7)])  # a small batch still fits
        taken = await spool.take(1000)
        assert taken is not None and len(taken.records) == 5
        await spool.done(taken)
        await spool.done(taken)  # done twice (two drainers): uncounted once
        assert await spool.held() == 0 and await client.xlen(key) == 0
        assert await spool.put(batch)
    finally:
        await spool.close()


async def test_with_postgresql_away_a_gateway_keeps_no_more_than_spool_max_mb_in_each_stream(
    start_gateway: Callable, http: aiohttp.ClientSession, redis_url: str, tmp_path: Path
) -> None:
    """Requests with long request ids through a gateway whose ledger database is away: every answer
    is served; the journal and the Redis spool each hold at most spool_max_mb as written, and every
    record is somewhere (journaled, spooled in Redis or on disk). In batches of five: a spool takes
    a batch whole or not at all, and sixty requests answered at full speed made one batch larger than
    a spool's bound, dropped whole (whether it did was timing's doing)."""
    gw = await start_gateway(
        ledger_config(
            NOWHERE,
            str(tmp_path / "spool"),
            flush_s=0.05,
            extra=f"""
state: {{backend: redis, url: "{redis_url}", prefix: "lb:"}}
""",
        ).replace("spool_dir:", "spool_max_mb: 0.02, write_timeout_s: 0.5, batch_size: 5, spool_dir:")
    )
    limit = int(0.02 * 1024 * 1024)
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    journaled, unjournaled = counted("journaled"), counted("unjournaled")
    statuses = []
    for n in range(60):
        async with http.post(
            gw.url + "/v1/messages", json=body, headers={**MSG, "X-Request-Id": f"{n:04d}-" + "q" * 120}
        ) as answer:
            await answer.read()
            statuses.append(answer.status)
    assert statuses == [200] * 60
    assert counted("journaled") - journaled + counted("unjournaled") - unjournaled == 60
    assert counted("unjournaled") - unjournaled > 0, "the journal's bound was reached"
    client = aioredis.Redis.from_url(redis_url)
    dropped = counted("dropped")

    async def kept() -> int:
        batches = [json.loads(fields[b"records"]) for _, fields in await client.xrange("lb:ledger:spool")]
        on_disk = sum(p.read_bytes().count(b"\n") for p in (tmp_path / "spool").glob("*.jsonl"))
        return await client.xlen("lb:ledger:journal") + sum(map(len, batches)) + on_disk

    try:
        for _ in range(200):  # the writer's turns: PostgreSQL away, what the journal did not take is spooled
            if await kept() + counted("dropped") - dropped == 60:
                break
            await asyncio.sleep(0.05)
        assert await kept() == 60  # every record is somewhere; none dropped (the file spool had room)
        for key in ("lb:ledger:journal", "lb:ledger:spool"):
            held = await stream_bytes(client, key)
            assert 0 < held <= limit and int(await client.get(beside(key))) == held, key
    finally:
        await client.aclose()
