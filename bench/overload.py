"""Overload: one worker offered three times what it can serve, with and without admission control.

The gateway's capacity is measured first (wrk, 64 connections, `POST /v1/messages` to the fast
bench upstream, as bench/run.py measures throughput). Then an open-loop generator offers requests
at a fixed rate, whatever the answers do (a closed loop would slow down with the gateway and
hide its queue): 10% of capacity for the unloaded latency, then 3x capacity. Each rate runs with
the upstream answering at once and 50 ms late (a model is slower still; the gateway's own
queueing is what grows), against the gateway as configured by default (`max_in_flight: auto`),
the same with a tighter loop-delay target (`max_loop_delay_ms: 10`), the same with the loop's
delay its only signal (`max_cpu_busy: 1`), and against one that admits everything
(`max_in_flight` = `max_connections`, as before admission control). Latency is counted from when
a request was due to go, so a generator that falls behind does not hide the wait; the admitted
latency is read once the overload's first second is past (the target is for an overload held),
and that first second is reported on its own. Each gateway is pinned to core 0 and held to a share of it
by a CPU quota (`--gateway-cpu`, 0.3; a cgroup of its own, bench/procs.py), the upstream takes
the rest of core 0, and the generator has core 1 to itself: with all three at full speed, a
Python generator cannot offer three times what a gateway serves, and sharing a core it starved
the upstream instead (the gateways then sat idle while requests waited). `--gateway-cpu 1`: no
quota, the generator and the upstream sharing core 1 as before.

Reports admitted (200) p50/p99 against the unloaded p99 (and the first second's p99), the share answered 503 `overloaded`,
and anything lost (no answer, or a connection broken) to bench/RESULTS.md, section "overload".

Usage: .venv/bin/python bench/overload.py [--duration S] [--gateway-cpu SHARE] [--print-only]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import CpuQuota, cpu_model, free_port, no_admin_listeners, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402

HERE = Path(__file__).parent
KEY = "bench-key-0123"
BODY = b'{"model":"msgmodel-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
DELAYS_MS = (0, 50)
# Two gateways at once: no admin listener, whose default port they would both take.
GATEWAYS = {
    "auto": "server: {listen: '127.0.0.1:{PORT}', admin_listen: ''}\n",
    # the target a latency bound under overload asks for (docs/security.md, "The target")
    "auto, 10 ms": "server: {listen: '127.0.0.1:{PORT}', admin_listen: '', max_loop_delay_ms: 10}\n",
    # the loop's delay alone, as `auto` was before it read the CPU's busy share
    "auto, delay only": "server: {listen: '127.0.0.1:{PORT}', admin_listen: '', max_cpu_busy: 1}\n",
    "admits everything": "server: {listen: '127.0.0.1:{PORT}', admin_listen: '', max_in_flight: 10000}\n",
    # what a refusal costs: one request held upstream, every other one refused
    "refuses": "server: {listen: '127.0.0.1:{PORT}', admin_listen: '', max_in_flight: 1}\n",
}
MAX_CONNECTIONS = 6000  # the generator's own bound: past it a request due is counted as not sent
ONSET_S = 1.0  # the overload's first second: reported on its own, the target is for the overload held


def request_bytes(delay_ms: int) -> bytes:
    delay = f"x-delay-ms: {delay_ms}\r\n" if delay_ms else ""
    return (
        f"POST /v1/messages HTTP/1.1\r\nHost: bench\r\nx-api-key: {KEY}\r\nmsgapi-version: 2023-06-01\r\n"
        f"Content-Type: application/json\r\n{delay}Content-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


# --- the generator (run in a process of its own, pinned to core 1) ---


class _Client(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer read by Content-Length."""

    def __init__(self, generator: _Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.due = 0.0  # when the request under way was due; 0: none

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, due: float) -> None:
        self.due = due
        self.transport.write(data)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        due, self.due = self.due, 0.0
        self.generator.answered(self, int(head[9:12]), due, b"connection: close" in head)

    def connection_lost(self, exc: Exception | None) -> None:
        self.generator.lost(self)


class _Generator:
    def __init__(self, host: str, port: int, data: bytes) -> None:
        self.host, self.port, self.data = host, port, data
        self.idle: collections.deque[_Client] = collections.deque()
        self.open = 0
        self.busy = 0
        self.latency: dict[int, list[float]] = collections.defaultdict(list)
        self.ok_due: list[float] = []  # when each request answered 200 was due, from the run's start
        self.start = 0.0
        self.broken = 0  # connections lost with a request under way
        self.unsent = 0  # due while the generator had no connection to spare

    async def connect(self) -> _Client:
        self.open += 1
        _, client = await asyncio.get_running_loop().create_connection(lambda: _Client(self), self.host, self.port)
        return client

    def answered(self, client: _Client, status: int, due: float, close: bool) -> None:
        self.latency[status].append(time.perf_counter() - due)
        if status == 200:
            self.ok_due.append(due - self.start)
        self.busy -= 1
        if close:
            client.transport.close()  # type: ignore[union-attr]
        else:
            self.idle.append(client)

    def lost(self, client: _Client) -> None:
        self.open -= 1
        if client.due:
            self.broken += 1
            self.busy -= 1
        try:
            self.idle.remove(client)
        except ValueError:
            pass

    def send(self, due: float) -> None:
        if self.idle:
            self.busy += 1
            self.idle.pop().send(self.data, due)
        elif self.open < MAX_CONNECTIONS:
            self.busy += 1
            asyncio.ensure_future(self._send_on_new(due))
        else:
            self.unsent += 1

    async def _send_on_new(self, due: float) -> None:
        try:
            client = await self.connect()
        except OSError:
            self.busy -= 1
            self.broken += 1
            return
        client.send(self.data, due)

    async def run(self, rate: float, duration: float, connections: int) -> dict[str, object]:
        for client in await asyncio.gather(*(self.connect() for _ in range(connections))):
            self.idle.append(client)
        start = self.start = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - start < duration:
            due_count = int((now - start) * rate) + 1  # request n is due at start + n / rate
            while sent < due_count:
                self.send(start + sent / rate)
                sent += 1
            await asyncio.sleep(0.0005)
        wait_until = time.perf_counter() + 15
        while self.busy > 0 and time.perf_counter() < wait_until:
            await asyncio.sleep(0.01)
        return {
            "sent": sent,
            "seconds": duration,
            "unanswered": self.busy,
            "broken": self.broken,
            "unsent": self.unsent,
            "ok_due": self.ok_due,
            "latency": {str(k): v for k, v in self.latency.items()},
        }


def generate(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    generator = _Generator("127.0.0.1", args.port, request_bytes(args.delay_ms))
    result = asyncio.run(generator.run(args.rate, args.duration, args.connections))
    Path(args.out).write_text(json.dumps(result))


# --- the orchestration ---


@dataclass
class Run:
    gateway: str
    delay_ms: int
    rate: float
    share: float  # of capacity
    sent: int
    ok: list[float]
    overloaded: int
    other: dict[str, int]
    lost: int
    unsent: int
    cpu_share: float

    ok_due: list[float]  # when each of `ok` was due, from the run's start

    def pct(self, q: float, onset: bool = False) -> float:
        """The admitted latency's quantile q in ms, once the first ONSET_S are past (or over them only)."""
        values = sorted(latency for latency, due in zip(self.ok, self.ok_due) if (due < ONSET_S) == onset)
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def start(cmd: list[str], core: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", str(core), *cmd], stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=HERE.parent
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, pid: int, work: Path, headers: dict[str, str] | None = None) -> tuple[float, float, float]:
    """wrk at 64 connections for 5 s: answers a second, the share that were 2xx, and the gateway's
    CPU ms per answer."""
    script = work / f"post-{time.monotonic_ns()}.lua"
    sent = {"x-api-key": KEY, "msgapi-version": "2023-06-01", "Content-Type": "application/json", **(headers or {})}
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{BODY.decode()}'\n"
        + "".join(f"wrk.headers['{k}'] = '{v}'\n" for k, v in sent.items())
    )
    before = cpu_seconds(pid)
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", "-c64", "-d5s", "-s", str(script), url + "/v1/messages"],
        capture_output=True,
        text=True,
    ).stdout
    total = int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, 1 - (int(errors[1]) / total if errors else 0), (cpu_seconds(pid) - before) * 1000 / total


def offer(
    gateway: str, url: str, pid: int, delay_ms: int, rate: float, share: float, duration: float, work: Path
) -> Run:
    out = work / f"gen-{time.monotonic_ns()}.json"
    port = url.rsplit(":", 1)[1]
    connections = min(MAX_CONNECTIONS, max(64, int(rate * (delay_ms / 1000 + 0.01) * 2)))
    before, began = cpu_seconds(pid), time.monotonic()
    subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            sys.executable,
            __file__,
            "--generate",
            "--port",
            port,
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--delay-ms",
            str(delay_ms),
            "--connections",
            str(connections),
            "--out",
            str(out),
        ],
        check=True,
    )
    cpu = (cpu_seconds(pid) - before) / (time.monotonic() - began)  # over the whole run, its tail included
    result = json.loads(out.read_text())
    latency = result["latency"]
    other = {status: len(values) for status, values in latency.items() if status not in ("200", "503")}
    run = Run(
        gateway,
        delay_ms,
        rate,
        share,
        result["sent"],
        latency.get("200", []),
        len(latency.get("503", [])),
        other,
        result["unanswered"] + result["broken"],
        result["unsent"],
        cpu,
        result["ok_due"],
    )
    print(
        f"{gateway:18} delay={delay_ms:>3}ms offered={rate:7.0f}/s ({share:.1f}x) 200={len(run.ok)} "
        f"503={run.overloaded} other={other} lost={run.lost} unsent={run.unsent} p50={run.pct(0.5):.2f}ms "
        f"p99={run.pct(0.99):.2f}ms (first {ONSET_S:g} s: {run.pct(0.99, onset=True):.2f}ms) cpu={cpu:.0%}",
        flush=True,
    )
    return run


def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--print-only", action="store_true", help="print the section, do not write RESULTS.md")
    parser.add_argument(
        "--gateway-cpu", type=float, default=0.3, help="the share of core 0 each gateway may use (1: no quota)"
    )
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.generate:
        generate(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="modelgate-overload-"))
    args.load_before = os.getloadavg()[0]
    up_port = free_port()
    # With the gateways held to a share of core 0, the upstream takes the rest of it, and the
    # generator has core 1 to itself: offering three times what a gateway serves, it must not be
    # what runs out of CPU first (sharing core 1, it starved the upstream, and the gateways sat idle).
    up_core = 0 if args.gateway_cpu < 1 else 1
    procs = [start([sys.executable, str(HERE / "upstream.py"), str(up_port)], up_core, work / "upstream.log")]
    gateways: dict[str, tuple[str, int]] = {}
    quotas: list[CpuQuota] = []
    try:
        wait_port(up_port)
        for name, extra in GATEWAYS.items():
            port = free_port()
            config = work / f"gateway-{port}.yaml"
            config.write_text(
                extra.replace("{PORT}", str(port)) + f"keys: [{{name: bench, key: {KEY}}}]\n"
                f"channels: [{{name: bench, base_url: 'http://127.0.0.1:{up_port}', credential: up}}]\n"
            )
            procs.append(start([sys.executable, "-m", "proxy", "serve", "-c", str(config)], 0, work / f"{port}.log"))
            gateways[name] = (f"http://127.0.0.1:{port}", procs[-1].pid)
            if args.gateway_cpu < 1:
                quotas.append(CpuQuota(procs[-1].pid, args.gateway_cpu))
        for url, _ in gateways.values():
            wait_port(int(url.rsplit(":", 1)[1]))
        # Measured on the gateway that admits everything: `auto` refuses what would load it past
        # its targets, which is what capacity is measured to find.
        whole_url, whole_pid = gateways["admits everything"]
        wrk(whole_url, whole_pid, work)  # warm-up
        rps, served_share, served_cpu = wrk(whole_url, whole_pid, work)
        measured = rps * served_share
        refuses_url, refuses_pid = gateways.pop("refuses")
        _, _, refused_cpu = wrk(refuses_url, refuses_pid, work, {"x-delay-ms": "10000"})
        args.cpu_ms = (served_cpu, refused_cpu)
        print(
            f"capacity: {measured:.0f} requests/s; CPU ms a request served {served_cpu:.3f}, refused {refused_cpu:.3f}",
            flush=True,
        )
        runs: list[Run] = []
        auto_url, auto_pid = gateways["auto"]
        for delay_ms in DELAYS_MS:
            runs.append(offer("auto", auto_url, auto_pid, delay_ms, 0.1 * measured, 0.1, args.duration, work))
            for name, (url, pid) in gateways.items():
                runs.append(offer(name, url, pid, delay_ms, 3 * measured, 3.0, args.duration, work))
    finally:
        stop_all(procs, 90)
        for quota in quotas:
            quota.remove()
    args.load_after = os.getloadavg()[0]
    section = report(measured, runs, args)
    if args.print_only:
        print(section)
    else:
        update_section("overload", section)
        print(section)
    return 0


def report(measured: float, runs: list[Run], args: argparse.Namespace) -> str:
    import platform

    cpu = cpu_model()
    lines = [
        "## Overload: three times capacity",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `.venv/bin/python bench/overload.py --duration "
        f"{args.duration:g} --gateway-cpu {args.gateway_cpu:g}`. Machine: {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}; "
        f"load average {args.load_before:.1f} at the start and {args.load_after:.1f} at the end (anything else "
        "running skews every figure: compare the capacity with the throughput section's). "
        "One gateway process on its defaults (access lines and metrics on) pinned to core 0"
        + (
            f", held to {args.gateway_cpu:.0%} of it by a CPU quota (the kernel's CPU controller), the bench "
            "upstream on the rest of core 0, and the open-loop generator alone on core 1 (so that it can offer "
            "three times what a gateway serves)"
            if args.gateway_cpu < 1
            else "; the open-loop generator and the bench upstream share core 1"
        )
        + ". Capacity: "
        f"{measured:,.0f} requests/s of `POST /v1/messages` (wrk, 64 connections, upstream answering at once), "
        f"{args.cpu_ms[0]:.3f} ms of the gateway's CPU a request; a refusal (503 `overloaded`) costs "
        f"{args.cpu_ms[1]:.3f} ms, {args.cpu_ms[1] / args.cpu_ms[0]:.0%} of that, so at 3x capacity refusing "
        f"the excess alone takes {2 * args.cpu_ms[1] / args.cpu_ms[0]:.0%} of the core.",
        "",
        "Each row offers requests at a fixed rate for the run's length, whatever the answers do; latency "
        "counts from when a request was due. Admitted p50 and p99 are over the requests due after the first "
        f"{ONSET_S:g} s; that first second, while `auto` finds the overload, is in a column of its own. 'auto' is "
        "the default `max_in_flight: auto` (`max_loop_delay_ms: 50`, `max_cpu_busy: 0.9`); "
        "'auto, 10 ms' the same with `max_loop_delay_ms: 10`; 'auto, delay only' with `max_cpu_busy: 1` (the "
        "loop's delay its only signal); 'admits everything' "
        "is `max_in_flight: 10000`, the gateway as it was before admission control. Unanswered: no answer 15 s "
        "after the run's end, or a connection broken under its request (or refused as it opened). Sent: what "
        "the generator managed to send "
        f"(it holds at most {MAX_CONNECTIONS:,} connections; a request due when all are busy is not sent).",
        "",
        "| upstream delay | gateway | offered/s (sent) | share of capacity | answered 200 | 503 overloaded | unanswered | "
        "admitted p50 ms | admitted p99 ms | p99 / unloaded p99 | first second: admitted, p99 ms | gateway CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for delay_ms in DELAYS_MS:
        rows = [r for r in runs if r.delay_ms == delay_ms]
        unloaded = next(r for r in rows if r.share < 1).pct(0.99)
        for r in rows:
            ratio = r.pct(0.99) / unloaded
            answered = len(r.ok) + r.overloaded + sum(r.other.values())
            lines.append(
                f"| {delay_ms} ms | {r.gateway} | {r.rate:,.0f} ({r.sent / args.duration:,.0f}) | "
                f"{r.share:.1f}x | {len(r.ok):,} | "
                f"{r.overloaded:,} ({r.overloaded / max(1, answered):.0%}) | {r.lost} | "
                f"{r.pct(0.5):.2f} | {r.pct(0.99):.2f} | {ratio:.1f}x | "
                f"{sum(due < ONSET_S for due in r.ok_due):,}, {r.pct(0.99, onset=True):.2f} | {r.cpu_share:.0%} |"
            )
            if r.share > 1 and r.gateway.startswith("auto"):
                verdicts.append(
                    f"- upstream {delay_ms} ms, {r.gateway}: "
                    f"admitted p99 {r.pct(0.99):.2f} ms is {ratio:.1f}x the "
                    f"unloaded {unloaded:.2f} ms (target: at most 2x) — {'met' if ratio <= 2 else 'NOT met'}; "
                    f"{r.overloaded / max(1, answered):.0%} answered 503 overloaded; "
                    f"{r.lost} unanswered"
                )
    return "\n".join(
        [
            *lines,
            "",
            "Against the target (admitted p99 within 2x the unloaded p99 at 3x capacity "
            f"once the overload's first {ONSET_S:g} s are past, every request answered):",
            "",
            *verdicts,
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
