"""The capacity model: Redis round trips and bytes per request for each route and plugin, CPU per
request of the gateway and of Redis, and from them the gateway cores, Redis shards and Redis
bandwidth a request rate needs. Writes docs/capacity.md and the `capacity` section of bench/RESULTS.md.

A redis-server of its own (free port) is reached by the gateway through a relay in this process
that records every burst the gateway writes and the bytes both ways; the upstream simulator sits
behind a relay too, so each round trip is known to come before or after the upstream call. wrk
then drives /v1/messages for CPU per request (gateway on core 0, everything else on core 1), and
a three-primary Cluster is read through each node's INFO counters.

Usage: .venv/bin/python bench/capacity.py [--requests N] [--duration S] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import hiredis
import orjson
import redis

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.capacity_report import DOC, write  # noqa: E402
from bench.procs import cpu_model, free_port, no_admin_listeners, stop_all, wait_port  # noqa: E402
from bench.run import cpu_seconds, start  # noqa: E402
from plugins.budget.counters import RESERVE, SETTLE  # noqa: E402
from plugins.ledger.journal import _APPEND  # noqa: E402
from proxy.ratelimits.redis import ACQUIRE, FINISH, RENEW  # noqa: E402
from proxy.state.redis import _ADD_THEN  # noqa: E402

ROOT = Path(__file__).parent.parent
KEY, PLAIN = "capacity-key-0123", "capacity-plain-01"
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
BEARER = {"Authorization": f"Bearer {KEY}"}
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
IMAGE = {"model": "imagegen-2", "prompt": "a fox", "size": "1024x1024", "n": 1}
SIGNED = {
    "Stripe-Signature": "t=1700000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd",
    "Content-Type": "application/json",
}
LIMITS = "limits: {rpm: 100000000, tpm: 1000000000, concurrent: 100000}"
# Whose a burst is, by a key it names (the state prefix is the default, modelgate:; a Cluster's
# keys carry hash tags, `{modelgate:webhooks}:pending`, one server's need not).
OWNERS = (
    (b"modelgate:webhooks", "webhook_queue"),
    (b"modelgate:rl:", "ratelimit"),
    (b"modelgate:pin:", "affinity"),
    (b"modelgate:video:", "video"),
    (b"modelgate:blob:", "url_delivery"),
    (b"modelgate:budget:", "budget"),
    (b"modelgate:ledger:", "ledger"),
)
SCRIPTS = {
    hashlib.sha1(s.encode()).hexdigest().encode(): n
    for s, n in (
        (ACQUIRE, "check"),
        (FINISH, "settle"),
        (RENEW, "lease renewal"),
        (_ADD_THEN, "pin+record"),
        (_APPEND, "journal"),
        (RESERVE, "reserve"),
        (SETTLE, "settle"),
    )
}
SETUP = (b"CLIENT", b"HELLO", b"AUTH", b"SELECT", b"SCRIPT")
GAP_S = 0.003  # after each answer, so work done after it (a settle) lands in its own request's window


class CommandReader:
    """A client's RESP stream as commands (hiredis reads them: a command is a RESP array of bulk
    strings); arguments are cut to 200 bytes, enough to name them."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()

    def feed(self, data: bytes) -> list[list[bytes]]:
        self.reader.feed(data)
        found = []
        while (command := self.reader.gets()) is not False:
            found.append([bytes(arg[:200]) for arg in command])
        return found


@dataclass
class Burst:
    """What a client wrote between two answers on one connection: one round trip."""

    at: float
    sent: int = 0
    received: int = 0
    commands: list[list[bytes]] = field(default_factory=list)

    @property
    def owner(self) -> str:
        if any(c[0].upper() == b"PING" for c in self.commands):
            return "background"  # the state store's probe, or a health check before a command
        if self.commands and all(c[0].upper() in SETUP for c in self.commands):
            return "background"  # a new connection introducing itself
        return self.owners[0] if self.owners else "other"

    @property
    def owners(self) -> list[str]:
        """Whose commands the burst carried, in order (a request's calls share one)."""
        return list(dict.fromkeys(_owner_of(c) for c in self.commands if c[0].upper() not in (b"MULTI", b"EXEC")))

    @property
    def name(self) -> str:
        calls = [(_owner_of(c), _word(c)) for c in self.commands if c[0].upper() not in (b"MULTI", b"EXEC")]
        if len({owner for owner, _ in calls}) <= 1:
            return f"{self.owner} {'+'.join(word for _, word in calls)}"
        return " + ".join(f"{owner} {word}" for owner, word in calls)


def _owner_of(command: list[bytes]) -> str:
    return next((name for marker, name in OWNERS if any(marker in a for a in command)), "other")


def _word(command: list[bytes]) -> str:
    if command[0].upper() != b"EVALSHA":
        return command[0].upper().decode()
    return SCRIPTS.get(command[1]) or ("lease" if command[3:] and command[3].endswith(b":lease") else "script")


class Relay:
    """A TCP relay that records each burst a client sends and the bytes of the answers to it.
    A pipeline or a script call is one burst: what is written before any answer comes back."""

    def __init__(self, target: int, parse: bool) -> None:
        self.target, self.parse = target, parse
        self.bursts: list[Burst] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target)
        link: dict[str, Any] = {"burst": None, "answered": True, "reader": CommandReader()}

        async def upward() -> None:
            while data := await client_r.read(1 << 16):
                if link["answered"]:
                    link["burst"], link["answered"] = Burst(time.perf_counter()), False
                    self.bursts.append(link["burst"])
                link["burst"].sent += len(data)
                if self.parse:
                    link["burst"].commands += link["reader"].feed(data)
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downward() -> None:
            while data := await server_r.read(1 << 16):
                link["answered"] = True
                if link["burst"] is not None:
                    link["burst"].received += len(data)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(upward(), downward(), return_exceptions=True)
        except asyncio.CancelledError:
            pass  # the measurement is over and its loop closing: nothing is left to relay


@dataclass
class Case:
    name: str
    method: str
    path: str | Callable[[int], str]
    headers: dict[str, str]
    body: Any = None  # JSON, bytes as they are, or a function of the request's index
    keep: tuple[str, str] | None = None  # (list, field): ids from the answers, for the follow-ups


@dataclass
class Row:
    case: Case
    trips: float
    by_owner: dict[str, float]
    sent: float
    received: float
    upstream: float
    sequence: str
    share: float
    others: Counter[str]  # what the unowned round trips were, to be named in the doc


def cases(made: dict[str, list[str]]) -> list[Case]:
    content = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={KEY}"
    return [
        Case("messages", "POST", "/v1/messages", MSG, MESSAGE),
        Case("messages, stream", "POST", "/v1/messages", MSG, {**MESSAGE, "stream": True}),
        Case("messages, key without limits", "POST", "/v1/messages", {**MSG, "x-api-key": PLAIN}, MESSAGE),
        Case("content generation", "POST", content, {}, {"contents": [{"parts": [{"text": "hi"}]}]}),
        Case(
            "responses create (stored)",
            "POST",
            "/v1/responses",
            BEARER,
            {"model": "respmodel-4o", "input": "hi", "store": True},
            ("responses", "id"),
        ),
        Case(
            "responses with previous_response_id",
            "POST",
            "/v1/responses",
            BEARER,
            lambda i: {"model": "respmodel-4o", "input": "and?", "previous_response_id": made["responses"][i]},
        ),
        Case(
            "video task create",
            "POST",
            "/v1/video/generations",
            BEARER,
            {"model": "videogen-3.0-generate-001", "prompt": "waves"},
            ("videos", "task_id"),
        ),
        Case("video status poll (cache miss)", "GET", lambda i: f"/v1/video/generations/{made['videos'][i]}", BEARER),
        Case("image generation, b64", "POST", "/v1/images/generations", BEARER, IMAGE),
        Case(
            "image generation, URL delivery",
            "POST",
            "/v1/images/generations",
            BEARER,
            {**IMAGE, "response_format": "url"},
        ),
        Case("payment webhook, queued", "POST", "/api/stripe/webhook", SIGNED, b'{"id":"evt_1","type":"charge"}'),
    ]


async def send(http: aiohttp.ClientSession, base: str, case: Case, i: int, made: dict[str, list[str]]) -> None:
    path = case.path(i) if callable(case.path) else case.path
    body = case.body(i) if callable(case.body) else case.body
    payload = {"data": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    async with http.request(case.method, base + path, headers=case.headers, **payload) as answer:
        data = await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{case.name}: {answer.status} {data[:300]!r}")
    if case.keep:
        made.setdefault(case.keep[0], []).append(orjson.loads(data)[case.keep[1]])


async def measure(
    http: aiohttp.ClientSession,
    base: str,
    case: Case,
    made: dict[str, list[str]],
    store: Relay,
    upstream: Relay,
    requests: int,
    warm: int,
) -> Row:
    for i in range(warm):  # connections opened, scripts loaded
        await send(http, base, case, i, made)
    await asyncio.sleep(0.5)  # the deliverer catches up with the warm-up's webhooks
    starts = []
    for i in range(warm, warm + requests):
        starts.append(time.perf_counter())
        await send(http, base, case, i, made)
        await asyncio.sleep(GAP_S)
    await asyncio.sleep(0.3)  # the webhook deliverer's last delivery
    return tally(case, [*starts, time.perf_counter()], store.bursts, upstream.bursts)


def tally(case: Case, starts: list[float], bursts: list[Burst], calls: list[Burst]) -> Row:
    """Each request's window runs from its start to the next one's: what Redis saw in it, and in what
    order around the upstream call. The deliverer's polling counts only for the webhook."""
    times, call_times = [b.at for b in bursts], [c.at for c in calls]
    webhook = case.path == "/api/stripe/webhook"
    sequences: Counter[str] = Counter()
    counted: list[Burst] = []
    upstream = 0
    for begin, end in zip(starts, starts[1:]):
        window = [
            b
            for b in bursts[bisect.bisect_left(times, begin) : bisect.bisect_left(times, end)]
            if b.owner != "background" and (webhook or b.owner != "webhook_queue")
        ]
        called = call_times[bisect.bisect_left(call_times, begin) : bisect.bisect_left(call_times, end)]
        upstream += len(called)
        words = [b.name for b in window if not called or b.at < called[0]]
        words += ["[upstream]"] * bool(called) + [b.name for b in window if called and b.at >= called[0]]
        sequences[" → ".join(words) or "none"] += 1
        counted += window
    n = len(starts) - 1
    owners = Counter(o for b in counted for o in b.owners)  # a shared round trip counts for each
    sequence, seen = sequences.most_common(1)[0]
    return Row(
        case,
        len(counted) / n,
        {k: v / n for k, v in owners.items()},
        sum(b.sent for b in counted) / n,
        sum(b.received for b in counted) / n,
        upstream / n,
        sequence,
        seen / n,
        Counter(f"{b.name} ({b.commands!r:.120})" for b in counted if b.owner == "other"),
    )


def gateway_yaml(port: int, state: str, upstream: str, extra: str = "") -> str:
    return (
        f'server: {{listen: "127.0.0.1:{port}", workers: 1}}\nstate: {state}\n'
        f"keys:\n  - {{name: bench, key: {KEY}, url_delivery: true, {LIMITS}}}\n"
        f"  - {{name: plain, key: {PLAIN}}}\n"
        f"channels: [{{name: upstream, base_url: '{upstream}', accepts_response_format: false}}]\n"
        "observability: {logging: {access_log: false}}\n" + extra
    )


def serve(work: Path, name: str, text: str) -> tuple[subprocess.Popen[bytes], str]:
    config = work / f"{name}.yaml"
    config.write_text(text)
    checked = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config)], capture_output=True, text=True, cwd=ROOT
    )
    if checked.returncode:
        raise RuntimeError(f"{name}: the gateway refuses its config:\n{checked.stdout}{checked.stderr}")
    port = int(re.search(r"127\.0\.0\.1:(\d+)", text)[1])  # type: ignore[index]
    proc = start([sys.executable, "-m", "proxy", "serve", "-c", str(config)], 0, work / f"{name}.log")
    wait_port(port)
    return proc, f"http://127.0.0.1:{port}"


def info(port: int) -> dict[str, float]:
    """A node's traffic counters and each command's calls and time so far."""
    with redis.Redis(port=port) as client:
        stats, commands = client.info("stats"), client.info("commandstats")
    found = {
        k: float(stats[k]) for k in ("total_commands_processed", "total_net_input_bytes", "total_net_output_bytes")
    }
    for name, values in commands.items():
        found[f"{name}:calls"], found[f"{name}:usec"] = values["calls"], values["usec"]
    return found


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def wrk(url: str, seconds: int, script: Path) -> tuple[int, float]:
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", "-c16", f"-d{seconds}s", "-s", str(script), url + "/v1/messages"],
        capture_output=True,
        text=True,
    ).stdout
    if "Requests/sec" not in out or "Non-2xx" in out:
        raise RuntimeError(f"wrk against {url} failed:\n{out}")
    return int(re.search(r"(\d+) requests in", out)[1]), float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]


def core_ticks(core: int) -> tuple[int, int]:
    """Busy and total ticks of one core so far (/proc/stat): whether anything beside the gateway ran there."""
    line = next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith(f"cpu{core} "))
    ticks = [int(v) for v in line.split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass
class PerCore:
    """One gateway under wrk: each figure is the median over the rounds."""

    state: str
    rps: float
    gateway_ms: float
    busy: float  # the gateway's share of core 0
    core_busy: float  # core 0's, whoever used it
    redis_us: float
    script_us: float  # Redis's own time inside EVALSHA (its inner commands are counted apart too)
    low: float  # the least and most gateway CPU a request of any round: this machine's spread
    high: float


def wrk_script(work: Path, key: str) -> Path:
    script = work / f"post-{key}.lua"
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{orjson.dumps(MESSAGE).decode()}'\n"
        + "".join(
            f"wrk.headers['{k}'] = '{v}'\n"
            for k, v in {**MSG, "x-api-key": key, "Content-Type": "application/json"}.items()
        )
    )
    return script


def wrk_round(url: str, pid: int, seconds: int, script: Path, redis_pid: int, redis_port: int) -> dict[str, float]:
    gateway, store, counters, core = cpu_seconds(pid), cpu_seconds(redis_pid), info(redis_port), core_ticks(0)
    began = time.monotonic()
    total, rps = wrk(url, seconds, script)
    used, elapsed = cpu_seconds(pid) - gateway, time.monotonic() - began
    store_used, spent = cpu_seconds(redis_pid) - store, delta(info(redis_port), counters)
    busy, ticks = (after - before for after, before in zip(core_ticks(0), core))
    return {
        "rps": rps,
        "gateway_ms": used * 1000 / total,
        "busy": used / elapsed,
        "core_busy": busy / ticks,
        "redis_us": store_used * 1e6 / total,
        "script_us": spent.get("cmdstat_evalsha:usec", 0.0) / total,
    }


def per_core(work: Path, upstream: str, redis_pid: int, redis_port: int, seconds: int, rounds: int) -> list[PerCore]:
    """CPU per request of the gateway (and of Redis) while wrk drives the messages route: three gateways up at
    once, measured in turn round after round, so the drift of a shared machine hits them alike."""
    setups = (
        ("redis", f'{{backend: redis, url: "redis://127.0.0.1:{redis_port}/0"}}', KEY),
        ("memory", "{backend: memory}", KEY),
        ("memory, key without limits", "{backend: memory}", PLAIN),
    )
    started = [
        serve(work, f"wrk-{i}", gateway_yaml(free_port(), state, upstream)) for i, (_, state, _) in enumerate(setups)
    ]
    scripts = [wrk_script(work, key) for *_, key in setups]
    runs: list[list[dict[str, float]]] = [[] for _ in setups]
    try:
        for (_, url), script in zip(started, scripts):
            wrk(url, 2, script)  # warm-up
        for _ in range(rounds):
            for (proc, url), script, found in zip(started, scripts, runs):
                found.append(wrk_round(url, proc.pid, seconds, script, redis_pid, redis_port))
    finally:
        stop_all((proc for proc, _ in started), 15)
    return [
        PerCore(
            label,
            **{k: statistics.median(r[k] for r in found) for k in found[0]},
            low=min(r["gateway_ms"] for r in found),
            high=max(r["gateway_ms"] for r in found),
        )
        for (label, *_), found in zip(setups, runs)
    ]


def window_bytes(port: int) -> tuple[float, int]:
    """Redis memory of the limit windows per request they hold (a sliding minute of requests)."""
    with redis.Redis(port=port) as client:
        keys = list(client.scan_iter("modelgate:rl:*"))
        held = max(client.zcard(k) for k in keys if k.endswith(b":rpm"))
        return sum(client.memory_usage(k, samples=0) or 0 for k in keys) / held, held


async def cluster_phase(work: Path, upstream: str, requests: int) -> dict[str, Any]:
    """The limited messages request on a three-primary Cluster, read from each node's INFO counters
    (a relay would need CLUSTER SLOTS rewritten); an idle stretch as long is taken off (probes, INFO)."""
    from redis.crc import key_slot

    from tests.redis_topologies import Cluster

    cluster = Cluster.start(work / "cluster")
    for proc in cluster.processes.processes.values():
        subprocess.run(["taskset", "-p", "-c", "1", str(proc.pid)], check=True, capture_output=True)
    gateway, base = serve(
        work, "cluster", gateway_yaml(free_port(), f'{{backend: redis, url: "{cluster.url}"}}', upstream)
    )
    try:
        async with aiohttp.ClientSession() as http:
            case = cases({})[0]
            for i in range(20):
                await send(http, base, case, i, {})
            await asyncio.sleep(0.2)
            s0, began = [info(p) for p in cluster.ports], time.monotonic()
            for i in range(requests):
                await send(http, base, case, i, {})
            s1, took = [info(p) for p in cluster.ports], time.monotonic() - began
            await asyncio.sleep(took)
            s2 = [info(p) for p in cluster.ports]
    finally:
        gateway.terminate()
        gateway.wait(timeout=15)
        cluster.processes.stop()
    nodes = []
    for port, a, b, c in zip(cluster.ports, s0, s1, s2):
        load, idle = delta(b, a), delta(c, b)
        net = {k: (load.get(k, 0) - idle.get(k, 0)) / requests for k in load}
        calls = {k.split(":")[0][8:]: round(v, 2) for k, v in net.items() if k.endswith(":calls") and round(v, 2)}
        nodes.append(
            {
                "port": port,
                "commands": max(0.0, net["total_commands_processed"]),
                "calls": calls,
                "scripts": calls.get("evalsha", 0.0),
                "in": max(0.0, net["total_net_input_bytes"]),
                "out": max(0.0, net["total_net_output_bytes"]),
            }
        )
    slot = key_slot(b"{key:bench}")
    holder = cluster.ports[bisect.bisect_right([5461, 10923], slot)]  # the ranges Cluster.start assigns
    return {"nodes": nodes, "slot": slot, "holder": holder}


def facts() -> dict[str, str]:
    cpu = cpu_model()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = [line for line in status.splitlines() if line[3:] not in ("docs/capacity.md", "bench/RESULTS.md")]  # ours
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2][2:]
    return {
        "cpu": f"{os.cpu_count()} cores ({cpu})",
        "redis": version,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit + (" with uncommitted changes in the working tree" if dirty else ""),
    }


async def sequential(work: Path, redis_port: int, requests: int) -> tuple[list[Row], dict[str, float]]:
    sim_port = free_port()
    store, upstream = Relay(redis_port, parse=True), Relay(sim_port, parse=False)
    sim = start(
        [sys.executable, "-m", "proxy", "simulate", "--port", str(sim_port), "--chunk-delay-ms", "0"],
        1,
        work / "simulator.log",
    )
    relay_port, http_port = await store.start(), await upstream.start()
    plugins = (
        "plugins:\n  url_delivery: {enabled: true, store: redis, signing_keys: [{id: k1, "
        "secret: capacity-signing-0123456789}]}\n  webhook_queue: {enabled: true}\n"
    )
    try:
        wait_port(sim_port)
        gateway, base = serve(
            work,
            "relayed",
            gateway_yaml(
                free_port(),
                f'{{backend: redis, url: "redis://127.0.0.1:{relay_port}/0"}}',
                f"http://127.0.0.1:{http_port}",
                plugins,
            ),
        )
        try:
            await asyncio.sleep(1.0)
            mark = len(store.bursts)
            await asyncio.sleep(3.0)  # idle: what a gateway process sends Redis on its own
            idle = Counter(b.name for b in store.bursts[mark:])
            background = {name: count / 3.0 for name, count in idle.items()}
            rows, made = [], {}
            async with aiohttp.ClientSession() as http:
                for case in cases(made):
                    rows.append(await measure(http, base, case, made, store, upstream, requests, 20))
                    row = rows[-1]
                    print(
                        f"{case.name:38} {row.trips:5.2f} trips  {row.sent:8.0f} B up {row.received:7.0f} B down  "
                        f"{row.sequence} ({row.share:.0%}) {dict(row.others) or ''}",
                        flush=True,
                    )
        finally:
            gateway.terminate()
            gateway.wait(timeout=15)
    finally:
        sim.terminate()
        sim.wait(timeout=15)
    return rows, background


async def phases(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    redis_port = free_port()
    redis_proc = start(
        [
            "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work),
        ],
        1,
        work / "redis.log",
    )
    up_port = free_port()
    fast = start([sys.executable, str(ROOT / "bench" / "upstream.py"), str(up_port), "20"], 1, work / "upstream.log")
    try:
        wait_port(redis_port)
        wait_port(up_port)
        rows, background = await sequential(work, redis_port, args.requests)
        upstream = f"http://127.0.0.1:{up_port}"
        cores = per_core(work, upstream, redis_proc.pid, redis_port, args.duration, args.rounds)
        entry, held = window_bytes(redis_port)
        for c in cores:
            print(
                f"{c.state}: {c.rps:,.0f} requests/s, gateway {c.gateway_ms:.3f} ms/request ({c.busy:.0%} of core 0, "
                f"core 0 {c.core_busy:.0%} busy), Redis {c.redis_us:.1f} us/request ({c.script_us:.1f} in scripts)",
                flush=True,
            )
        cluster = await cluster_phase(work, upstream, args.requests)
        print(f"cluster: {cluster}", flush=True)
    finally:
        stop_all((fast, redis_proc), 15)
    return {
        "rows": rows,
        "background": background,
        "cores": cores,
        "entry": entry,
        "held": held,
        "cluster": cluster,
        "requests": args.requests,
        "duration": args.duration,
        "rounds": args.rounds,
    }


def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per route")
    parser.add_argument("--duration", type=int, default=4, help="seconds of each wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="wrk runs of each gateway, interleaved")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})  # the relays and clients of this process stay off the gateway's core
    work = Path(tempfile.mkdtemp(prefix="modelgate-capacity-"))
    out = asyncio.run(phases(work, args))
    out["facts"] = facts()
    write(out)
    print(DOC.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
