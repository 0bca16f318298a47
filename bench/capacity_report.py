"""docs/capacity.md and the `capacity` section of bench/RESULTS.md, written from one run of
bench/capacity.py: the tables from its measurements, the prose around them from this template."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.results import update_section

if TYPE_CHECKING:
    from bench.capacity import PerCore, Row

DOC = Path(__file__).parent.parent / "docs" / "capacity.md"
UTIL = 0.7  # the share of a core or shard the sizing plans to use
RATES = (10_000, 100_000, 1_000_000)
PLUGINS = ("ratelimit", "affinity", "video", "url_delivery", "webhook_queue")


def sizing(limited: Row, redis_core: PerCore, entry: float) -> list[dict[str, float]]:
    return [
        {
            "rate": rate,
            "cores": math.ceil(rate * redis_core.gateway_ms / 1000 / UTIL),
            "shards": math.ceil(rate * redis_core.redis_us / 1e6 / UTIL),
            "mbps": rate * (limited.sent + limited.received) / 1e6,
            "gb": rate * 60 * entry / 1e9,
        }
        for rate in RATES
    ]


def route_table(rows: list[Row]) -> list[str]:
    owners = PLUGINS + ("other",) * any(r.by_owner.get("other") for r in rows)  # a column only when needed
    lines = [
        "| request | round trips | " + " | ".join(owners) + " | bytes to Redis | bytes from Redis | "
        "upstream calls | order of one request (share of requests) |",
        "|---|---|" + "---|" * len(owners) + "---|---|---|---|",
    ]
    for r in rows:
        split = " | ".join(f"{r.by_owner[p]:.2f}" if r.by_owner.get(p) else "-" for p in owners)
        lines.append(
            f"| {r.case.name} | {r.trips:.2f} | {split} | {r.sent:,.0f} | {r.received:,.0f} | "
            f"{r.upstream:.2f} | {r.sequence} ({r.share:.0%}) |"
        )
    unowned = [f"{r.case.name}: {', '.join(r.others)}" for r in rows if r.others]
    return lines + ([""] + ["Round trips no plugin's key names ('other'): " + "; ".join(unowned)] if unowned else [])


def write(out: dict[str, Any]) -> None:
    rows, (db, memory, plain), cluster, f = out["rows"], out["cores"], out["cluster"], out["facts"]
    limited = next(r for r in rows if r.case.name == "messages")
    image = next(r for r in rows if r.case.name.endswith("URL delivery"))
    per_gw, per_shard = 1000 / db.gateway_ms, 1e6 / db.redis_us
    hot, plan, entry = UTIL * per_shard, sizing(limited, db, out["entry"]), out["entry"]
    first = "gateway CPU" if per_gw < per_shard else "Redis CPU"
    trip_ms = (db.gateway_ms - plain.gateway_ms) / limited.trips
    spread = memory.gateway_ms - plain.gateway_ms
    in_memory = (
        f"{spread:.3f} ms of CPU a request"
        if abs(spread) > 0.05 * plain.gateway_ms
        else f"nothing outside the noise of a run ({memory.gateway_ms:.3f} against {plain.gateway_ms:.3f} ms)"
    )
    cmd = f".venv/bin/python bench/capacity.py --requests {out['requests']} --duration {out['duration']} --rounds {out['rounds']}"
    idle = out["background"]
    lines = [
        "# Capacity",
        "",
        "What one request costs the gateway and its Redis, measured, and what a request rate needs from them. "
        f"`bench/capacity.py` wrote this file from one run ({f['date']}, commit {f['commit']}; {f['cpu']}, Redis "
        f"{f['redis']}, Python {f['python']}). Rerun it (`{cmd}`, under three minutes) rather than editing numbers.",
        "",
        "## Redis round trips and bytes per request",
        "",
        f"{out['requests']} sequential requests per row after 20 of warm-up, one gateway process (`workers: 1`, access "
        "log off) with `state.backend: redis`, URL delivery into the Redis store and the webhook queue on; the key has "
        "rpm, tpm and concurrent limits unless the row says otherwise. The gateway reaches Redis through a relay "
        "that counts each burst written on a connection before its answer comes back as one round trip (so a "
        "pipeline, a MULTI/EXEC transaction or a script call is one), with the bytes both ways. The upstream "
        "simulator sits behind a relay of its own, which places each round trip before or after the upstream call; "
        "the last column is the most common order and the share of requests that followed it (`a + b`: one round "
        "trip carrying both). A round trip that carries several plugins' calls counts in each of their columns, so "
        "a row's columns can add up to more than its round trips. A video task's pin, record and place on its "
        "tenant's list are one script (`pin+record`), which writes the record only if the pin is the request's.",
        "",
        *route_table(rows),
        "",
        f"Not counted above, as it does not grow with requests: idle, one gateway process sent Redis "
        f"{sum(idle.values()):.1f} round trips a second ({', '.join(f'{k} {v:.1f}/s' for k, v in sorted(idle.items()))}): "
        "the state store's probe and the webhook deliverer's lease, blocking read and queue depth. The webhook row "
        "counts the deliverer's work for each callback (depth, the delivery as its upstream call, the move to the "
        "delivered shelf, the lease, the next blocking read) beside the request's own queue length and append.",
        "",
        f"URL delivery writes the image into Redis: {image.sent:,.0f} bytes a request here, for the simulator's small "
        "solid-colour PNG. A real image of 1-2 MB sends that much per image, and then the image bytes, not round "
        "trips, are what Redis and its network carry.",
        "",
        "## CPU per request",
        "",
        f"wrk, 16 connections, on `POST /v1/messages`: three gateways (one process each) up at once and measured in "
        f"turn, {out['duration']} s each, over {out['rounds']} rounds after a 2 s warm-up; each figure is the median "
        "of the rounds, and the range of the gateway's CPU shows how much a run moves on this machine. The "
        "gateways are pinned to core 0; wrk, Redis and a fast canned upstream (bench/upstream.py, so "
        "the upstream never limits) to core 1. CPU is read from /proc for the gateway and redis-server over the run; "
        "'in scripts' is Redis's own time inside EVALSHA (INFO commandstats), the rest of its CPU being network I/O. "
        "The rows differ only in the state backend and the key (URL delivery and the webhook queue, which do not run "
        "on this route, are off).",
        "",
        "| state | requests/s | core 0 busy (the gateway) | gateway CPU ms/request (range) | requests/s per gateway core | "
        "Redis CPU us/request | in scripts us/request | requests/s per Redis shard |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in (db, memory, plain):
        on_redis = c is db
        lines.append(
            f"| {c.state} | {c.rps:,.0f} | {c.core_busy:.0%} ({c.busy:.0%}) | {c.gateway_ms:.3f} "
            f"({c.low:.3f}-{c.high:.3f}) | "
            f"{1000 / c.gateway_ms:,.0f} | {f'{c.redis_us:.1f}' if on_redis else '-'} | "
            f"{f'{c.script_us:.1f}' if on_redis else '-'} | {f'{1e6 / c.redis_us:,.0f}' if on_redis else '-'} |"
        )
    lines += [
        "",
        f"The limits cost the gateway {in_memory} with memory state and {db.gateway_ms - plain.gateway_ms:.3f} ms "
        f"with Redis state ({db.gateway_ms / plain.gateway_ms:.2f}x the request without limits): the two script calls, "
        "their arguments made and their replies read in the gateway's process, about "
        f"{trip_ms:.2f} ms of gateway CPU per Redis round trip. Redis was {db.redis_us * db.rps / 1e6:.0%} busy in the "
        "first row; a busier Redis reads and answers more commands per wake-up, so its figure per request is on the "
        "safe side. The last row is nearly the gateway bench/RESULTS.md's throughput section measures (which "
        "also writes access lines), so it relates this run's machine to that run's.",
        "",
        "## On a Redis Cluster",
        "",
        f"The limited messages request against three primaries (no replicas), {out['requests']} sequential requests, "
        "read from each node's INFO counters less an idle stretch as long (the probe's PINGs, the INFO calls "
        "themselves). A relay per node would need the addresses in CLUSTER SLOTS rewritten, which the gateway's "
        f"cluster client has no option for. The key's limits share the hash tag `{{key:bench}}` (slot "
        f"{cluster['slot']}), so all of them live on one node and each call is one round trip there.",
        "",
        "| node | holds the key's slot | script calls (round trips)/request | commands/request, the scripts' own "
        "included | bytes in/request | bytes out/request |",
        "|---|---|---|---|---|---|",
    ]
    for n in cluster["nodes"]:
        lines.append(
            f"| {n['port']} | {'yes' if n['port'] == cluster['holder'] else 'no'} | {n['scripts']:.2f} | "
            f"{n['commands']:.2f} | {n['in']:,.0f} | {n['out']:,.0f} |"
        )
    lines += [
        "",
        "## Sizing",
        "",
        f"For `POST /v1/messages` with a limited key, the common path that touches Redis on every request "
        f"({limited.trips:.0f} round trips, {limited.sent + limited.received:,.0f} bytes). Cores and shards are "
        f"planned {UTIL:.0%} busy: a gateway core then serves {UTIL * per_gw:,.0f} requests/s of it and a Redis shard "
        f"{hot:,.0f} ({per_gw:,.0f} and {per_shard:,.0f} at 100%). The limit windows keep an entry per request of "
        f"the last minute: {entry:.0f} bytes of Redis memory per request held (MEMORY USAGE over the "
        f"{out['held']:,} requests in the window after the run).",
        "",
        "| requests/s | gateway cores | Redis shards (load spread over many keys) | Redis network | limit windows in Redis memory |",
        "|---|---|---|---|---|",
        *(
            f"| {p['rate']:,} | {p['cores']:,} | {p['shards']:,} | {p['mbps']:,.1f} MB/s ({p['mbps'] * 8 / 1000:.2f} "
            f"Gbit/s) | {p['gb']:,.1f} GB |"
            for p in plan
        ),
        "",
        "## Where the first bottleneck appears",
        "",
        f"- **{first[0].upper() + first[1:]}** saturates first: one Redis shard keeps up with "
        f"{per_shard / per_gw:.1f} gateway cores on this route, so every rate above needs about "
        f"{max(per_shard / per_gw, per_gw / per_shard):.0f} times as many "
        f"{'gateway cores as Redis shards' if first == 'gateway CPU' else 'Redis shards as gateway cores'}. Gateway "
        "instances share nothing but Redis, so they scale out behind a load balancer.",
        f"- **One hot key is capped by one shard.** On a Cluster a key's limit counters share a hash tag, so a "
        f"slot, and a slot lives on one shard however many there are: {hot:,.0f} requests/s for a single limited key at {UTIL:.0%} of "
        f"a shard ({per_shard:,.0f} at 100%). Past that, adding shards does not help; spread the traffic over "
        "several keys (each with its share of the limit), or leave that key without limits (0 round trips).",
        f"- **Redis memory** of the windows grows with the rate: {plan[1]['gb']:.1f} GB at 100k requests/s and "
        f"{plan[2]['gb']:.1f} GB at 1M, spread with the keys; a hot key's windows all sit on its shard "
        f"({hot * 60 * entry / 1e9:.2f} GB at the cap above).",
        f"- **Redis network** is not the limit: {plan[2]['mbps'] * 8 / 1000:.1f} Gbit/s in all at 1M requests/s, "
        f"{hot * (limited.sent + limited.received) * 8 / 1e6:.0f} Mbit/s for a shard at the cap. URL delivery into "
        "Redis carries whole images and is the exception (use the S3 store at volume).",
        "",
        "## Assumptions and limits",
        "",
        "- CPU per request is from one core of this machine at 16 connections; another CPU scales both the "
        "gateway's and Redis's figures, so rerun the script where they will run. Linear scaling over cores and "
        "instances assumes connections spread evenly and nothing else shares the cores (the table shows how busy "
        "core 0 was in all, and how much of it was the gateway).",
        "- The answers are small and short; a long stream costs the gateway more CPU (per event) but no more Redis "
        f"round trips. Rows with more round trips cost the gateway about {trip_ms:.2f} ms more for each.",
        "- Redis runs on loopback with persistence off. AOF, TLS and replicas add CPU on a shard; a network "
        "between gateway and Redis adds latency to each round trip (one before the upstream call on every route), "
        "not CPU.",
        f"- A window holds every request of its last minute; the Redis CPU was measured with about "
        f"{out['held']:,} entries in it. Trimming costs grow slowly (logarithmically) with the window.",
        "- Round trips are bursts between answers on one connection: commands sent together without waiting count "
        "as one, as they cost one wait. Background traffic, connection setup and `/metrics` scrapes are left out.",
        "",
    ]
    DOC.write_text("\n".join(lines))
    update_section(
        "capacity",
        "\n".join(
            [
                "## Capacity",
                "",
                f"`{cmd}` ({f['date']}, {f['cpu']}, Redis {f['redis']}); the model is docs/capacity.md.",
                "",
                "- Redis round trips per request: " + ", ".join(f"{r.case.name} {r.trips:.2f}" for r in rows),
                f"- `POST /v1/messages`, limited key: gateway {db.gateway_ms:.3f} ms CPU a request with Redis state "
                f"({per_gw:,.0f} requests/s per core), {memory.gateway_ms:.3f} ms with memory state, {plain.gateway_ms:.3f} ms "
                f"with memory state and no limits; Redis "
                f"{db.redis_us:.1f} us CPU a request ({per_shard:,.0f} requests/s per shard)",
                f"- at {UTIL:.0%} busy: "
                + "; ".join(
                    f"{p['rate']:,}/s needs {p['cores']:,} gateway cores and {p['shards']:,} Redis shards" for p in plan
                ),
                f"- first bottleneck: {first}; one limited key is capped at {hot:,.0f} requests/s by its shard",
            ]
        ),
    )
