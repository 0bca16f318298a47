"""Few round trips: with Redis state, a request on the default pipeline makes one round trip to
Redis before its upstream call (its limit check, with the record of the id it follows and the
status it may have cached) and one after it (its settlement, with its pin, its task's record or its image;
with budgets and the ledger, their settlement and the record's journal entry too).

Counted as docs/capacity.md counts them: Redis and the upstream are each reached through a relay
(bench/capacity.py) that records every burst a connection writes before its answer comes back.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from urllib.parse import urlsplit

import aiohttp
import pytest

from bench.capacity import LIMITS, Relay, cases, measure
from bench.procs import free_port, wait_port

# What the settlement shares its round trip with: a pin; a task's pin and record, in one script
# that writes the record only if the pin is the request's; a cached status; an image.
WRITES_AFTER = {
    "responses create (stored)": "affinity SET",
    "responses with previous_response_id": "affinity SET",
    "video task create": "affinity pin+record",
    "video status poll (cache miss)": "video SET",
    "image generation, URL delivery": "url_delivery script",
}


@pytest.fixture
async def relayed(start_gateway, redis_url, tmp_path):
    async with _relayed(start_gateway, redis_url, tmp_path) as found:
        yield found


@contextlib.asynccontextmanager
async def _relayed(start_gateway, redis_url, tmp_path, key="", extra=""):
    target = urlsplit(redis_url)
    sim_port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "proxy", "simulate", "--port", str(sim_port), "--chunk-delay-ms", "0"],
        stdout=(tmp_path / "simulator.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(sim_port)
        store, upstream = Relay(target.port or 6379, parse=True), Relay(sim_port, parse=False)
        store_port, upstream_port = await store.start(), await upstream.start()
        gateway = await start_gateway(f"""
            state: {{backend: redis, url: "redis://127.0.0.1:{store_port}{target.path}"}}
            keys:
              - {{name: bench, key: capacity-key-0123, url_delivery: true, {LIMITS}{key}}}
            channels: [{{name: upstream, base_url: "http://127.0.0.1:{upstream_port}", accepts_response_format: false}}]
            plugins:
              url_delivery: {{enabled: true, store: redis, signing_keys: [{{id: k1, secret: rt-signing-0123456789abcdef}}]}}
              {extra}
            observability: {{logging: {{access_log: false}}}}
            """)
        yield gateway, store, upstream
    finally:
        sim.terminate()
        sim.wait(timeout=15)


async def test_each_keyed_request_makes_one_round_trip_to_redis_before_its_upstream_call_and_one_after(relayed):
    gateway, store, upstream = relayed
    made: dict[str, list[str]] = {}
    keyed = [c for c in cases(made) if c.name not in ("payment webhook, queued", "messages, key without limits")]
    assert len(keyed) == 9
    async with aiohttp.ClientSession() as http:
        for case in keyed:
            row = await measure(http, gateway.url, case, made, store, upstream, requests=12, warm=3)
            before, _, after = row.sequence.partition("[upstream]")
            assert row.upstream == 1.0, case.name
            assert before.count("→") == 1, f"{case.name}: {row.sequence}"  # one round trip, then the upstream
            assert after.count("→") == 1, f"{case.name}: {row.sequence}"
            # The usual request's sequence (above) and most of them: a request's window runs to the
            # next one's start, and on a loaded machine a late burst can fall into the next window.
            assert row.share >= 0.75 and 1.75 <= row.trips <= 2.25, f"{case.name}: {row.sequence} ({row.share:.0%})"
            if case.name.startswith(("responses with", "video status")):  # the follow rides with the check
                assert "ratelimit check + affinity GET" in before, row.sequence
            if case.name in WRITES_AFTER:  # the settlement rides with the pin, the image or the status
                assert (
                    f"{WRITES_AFTER[case.name]} + ratelimit settle" in after
                    or f"ratelimit settle + {WRITES_AFTER[case.name]}" in after
                ), row.sequence


async def test_with_budgets_and_the_ledger_the_settlements_and_the_journal_append_share_the_round_trip_after(
    start_gateway, redis_url, ledger_db, tmp_path
) -> None:
    """The rate limits', the budget's and the record's journal entry: one round trip after the
    answer, as streams and JSON answers end (the writer's own calls wait for its next turn, a
    minute away)."""
    budget = ", budget: {cost_per_day: 1000000, tokens_per_day: 1000000000}"
    spool = tmp_path / "spool"
    ledger = (
        f'ledger: {{database_url: "{ledger_db}", flush_interval_s: 60, spool_dir: "{spool}"}}\n'
        '            prices: [{model: "msgmodel-*", input_per_mtok: 3, output_per_mtok: 15}]'
    )
    async with _relayed(start_gateway, redis_url, tmp_path, budget, ledger) as (gateway, store, upstream):
        made: dict[str, list[str]] = {}
        chosen = [c for c in cases(made) if c.name in ("messages", "messages, stream")]
        async with aiohttp.ClientSession() as http:
            for case in chosen:
                row = await measure(http, gateway.url, case, made, store, upstream, requests=12, warm=3)
                _, _, after = row.sequence.partition("[upstream]")
                assert row.upstream == 1.0, case.name
                assert after.count("→") == 1, f"{case.name}: {row.sequence}"
                together = " → ratelimit settle + budget settle + ledger journal"
                assert after == together, row.sequence
