"""Admission control: past its bound on requests in flight a worker answers 503 `overloaded` with
Retry-After, in the endpoint's shape, before reading a body; what it admitted is served; the
`auto` bound follows the event loop's delay (driven here by a stepped clock)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from urllib.parse import urlsplit

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client import REGISTRY

from proxy.process.admission import (
    BEHIND,
    CUT_S,
    FAR,
    MIN_CUT_ARRIVALS,
    MIN_LIMIT,
    MIN_SHARE,
    PROBE_S,
    WINDOW_S,
    Admission,
)
from proxy.process.cpu import REREAD_S, WorkerCpu, quota_cores
from proxy.registry import parse_config
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS, SteppedClock
from tests.polling import within

SLOW = {"x-sim-latency-ms": "3000"}  # the simulator holds each admitted request this long
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CONTENT = {"contents": [{"parts": [{"text": "hi"}]}]}
RESPONSE = {"model": "respmodel-4o", "input": "hi"}


def shed(route: str, reason: str = "overloaded") -> float:
    return REGISTRY.get_sample_value("modelgate_requests_shed_total", {"route": route, "reason": reason}) or 0.0


async def test_past_its_bound_a_gateway_answers_503_overloaded_and_serves_what_it_admitted(start_gateway) -> None:
    gw = await start_gateway("""
        server: {max_in_flight: 4}
        observability: {logging: {access_log: false}}
    """)
    before = {route: shed(route) for route in ("messages", "generate_content", "responses")}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def post(path: str, body: dict, headers: dict) -> tuple[int, CIMultiDict[str], dict]:
            async with http.post(gw.url + path, json=body, headers=headers) as answer:
                return answer.status, CIMultiDict(answer.headers), await answer.json()

        admitted = [asyncio.ensure_future(post("/v1/messages", MESSAGE, {**MESSAGE_HEADERS, **SLOW})) for _ in range(4)]
        await within(5, lambda: len(gw.sim().requests) == 4, "four requests upstream", every=0.01)
        # Far more than it admits, at once, in three formats: each is answered, in its own shape.
        excess = [post("/v1/messages", MESSAGE, MESSAGE_HEADERS) for _ in range(12)]
        excess += [
            post(f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", CONTENT, {}) for _ in range(12)
        ]
        excess += [post("/v1/responses", RESPONSE, BEARER) for _ in range(12)]
        refused = await asyncio.gather(*excess)
        # Never shed, however full: the health checks and the metrics, on either listener.
        for url in (gw.url + "/healthz", gw.url + "/readyz", gw.admin + "/readyz", gw.admin + "/metrics"):
            async with http.get(url) as answer:
                assert answer.status == 200, url
        served = await asyncio.gather(*admitted)
    assert [status for status, _, _ in served] == [200] * 4
    assert all(body["type"] == "message" for _, _, body in served)
    assert {status for status, _, _ in refused} == {503}
    assert all(headers["Retry-After"] == "1" and headers.get("X-Request-Id") for _, headers, _ in refused)
    messages, content, responses = refused[:12], refused[12:24], refused[24:]
    assert all(
        body["error"]["code"] == "overloaded" and body["error"]["type"] == "server_error" for _, _, body in messages
    )
    assert all(
        body["error"]["status"] == "UNAVAILABLE" and body["error"]["details"][0]["reason"] == "overloaded"
        for _, _, body in content
    )
    assert all(body["error"]["code"] == "overloaded" for _, _, body in responses)
    assert len(gw.sim().requests) == 4  # nothing refused went upstream
    assert shed("messages") - before["messages"] == 12 and shed("responses") - before["responses"] == 12
    assert shed("generate_content") - before["generate_content"] == 12
    async with aiohttp.ClientSession() as http:  # the bound is free again: served
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 200


async def test_the_refusal_is_decided_before_the_body_is_read(start_gateway) -> None:
    """A request over the bound whose 10 MB body has barely begun is answered at once: no byte
    more of it is waited for."""
    gw = await start_gateway("server: {max_in_flight: 1}\n")
    async with aiohttp.ClientSession() as http:
        held = asyncio.ensure_future(http.post(gw.url + "/v1/responses", json=RESPONSE, headers={**BEARER, **SLOW}))
        await within(5, lambda: len(gw.sim().requests) == 1, "one request upstream", every=0.01)
        parts = urlsplit(gw.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(
            b"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-demo-key\r\n"
            b'Content-Type: application/json\r\nContent-Length: 10485760\r\n\r\n{"model":'
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        async with await held as answer:
            assert answer.status == 200


class Cpu:
    """The CPU time a test says the worker's loop used (`used`), on a quota of `cores`."""

    def __init__(self, clock: SteppedClock, cores: float | None = None) -> None:
        self.seconds = 0.0
        self.worker = WorkerCpu(1, quota=lambda: cores, used=lambda: self.seconds, clock=clock)


def admission(
    server: str = "", clock: SteppedClock | None = None, cpu: Cpu | None = None
) -> tuple[Admission, SteppedClock]:
    """A bound kept for a loop delay of 10 ms (the delays below are read against it), with `server`
    settings, on a CPU that stays idle unless `cpu` is told otherwise."""
    clock = clock or SteppedClock()
    cpu = cpu or Cpu(clock)
    return Admission(parse_config(f"server: {{max_loop_delay_ms: 10, {server}}}", {}).server, clock, cpu.worker), clock


def windows(gate: Admission, clock: SteppedClock, delay_s: float, in_flight: int, count: int = 1) -> None:
    """`count` windows of probes that each found the loop `delay_s` late, with `in_flight` requests."""
    probes = int(WINDOW_S / PROBE_S)
    for _ in range(count):
        for index in range(probes):
            clock.advance(PROBE_S if index < probes - 1 else WINDOW_S)  # the last one surely ends the window
            gate.observe(delay_s, in_flight)


def test_a_fixed_bound_admits_that_many_and_never_moves() -> None:
    gate, clock = admission("max_in_flight: 3")
    assert [gate.admits(n) for n in range(5)] == [True, True, True, False, False]
    windows(gate, clock, 0.5, 3, count=5)  # however late the loop
    windows(gate, clock, 0.0, 3, count=5)  # or idle
    assert gate.limit == 3 and gate.delay_s == 0.0


def test_auto_starts_at_max_connections_and_cuts_to_what_is_in_flight_when_the_loop_is_late() -> None:
    gate, clock = admission("max_connections: 5000")
    assert gate.limit == 5000 and gate.admits(4999) and not gate.admits(5000)
    windows(gate, clock, 0.020, 400)  # twice the 10 ms target, 400 in flight: at once to 400 * 0.5
    assert gate.limit == 200
    assert gate.admits(199) and not gate.admits(200)
    windows(gate, clock, 0.011, 200)  # just over: by a tenth of what is in flight
    assert gate.limit == pytest.approx(180)
    windows(gate, clock, 1.0, 180, count=20)
    assert gate.limit == MIN_LIMIT  # never below: an overloaded worker still serves some


def test_auto_grows_back_only_while_the_bound_is_used_and_the_loop_keeps_up() -> None:
    gate, clock = admission("max_connections: 1000")
    windows(gate, clock, 0.050, 100)
    assert gate.limit == 50
    windows(gate, clock, 0.001, 10, count=3)  # the 100 still in flight used it: doubled; then 10 do not: it stays
    assert gate.limit == 100
    assert not gate.admits(100)  # a refusal uses it: doubled at the next window
    windows(gate, clock, 0.001, 10)
    assert gate.limit == 200
    gate.admits(190)  # 90% of it in flight uses it too; a loop near its target adds one
    windows(gate, clock, 0.007, 10)
    assert gate.limit == 201
    for _ in range(10):
        gate.admits(int(gate.limit) - 1)
        windows(gate, clock, 0.001, 10)
    assert gate.limit == 1000  # never above max_connections


def busy_windows(
    gate: Admission, clock: SteppedClock, delay_s: float, in_flight: int, arrivals: int, count: int = 1
) -> list[bool]:
    """`windows`, with `arrivals` requests asked about in each: what each was told."""
    told = []
    for _ in range(count):
        told += [gate.admits(in_flight) for _ in range(arrivals)]
        windows(gate, clock, delay_s, in_flight)
    return told


def test_auto_admits_a_share_of_short_requests_while_they_make_the_loop_late() -> None:
    """Few in flight, many arriving, the loop late: the bound on requests in flight cannot help,
    so a share of the arrivals is admitted, spread evenly, and it grows back once the loop keeps up."""
    gate, clock = admission()
    busy_windows(gate, clock, 0.020, 2, arrivals=50)  # twice the target: half
    assert gate.share == 0.5 and gate.limit == 10_000
    told = [gate.admits(2) for _ in range(100)]
    assert told.count(True) == 50 and all(a != b for a, b in zip(told, told[1:]))  # every other one
    busy_windows(gate, clock, 1.0, 2, arrivals=50, count=30)
    assert gate.share == MIN_SHARE  # never below: it still serves some
    busy_windows(gate, clock, 0.007, 2, arrivals=50, count=3)  # near the target: held
    assert gate.share == MIN_SHARE
    busy_windows(gate, clock, 0.001, 2, arrivals=50, count=20)  # well under it: a quarter more a window
    assert gate.share == 1.0 and all(gate.admits(2) for _ in range(100))


BEHIND_S = 0.010 * BEHIND  # late enough, against the 10 ms target, for a busy CPU to count
_CLIMBING = itertools.count(3)  # requests in flight, one more at each probe: an open loop's onset


def run_busy(
    gate: Admission,
    clock: SteppedClock,
    cpu: Cpu,
    seconds: float,
    busy: float,
    arrivals: int,
    delay_s: float = BEHIND_S,
    in_flight: int | None = None,
) -> None:
    """`seconds` of probes, each finding the loop `delay_s` late, the CPU `busy` (of what the worker
    may use: a quarter of a core here), `arrivals` requests asked about since the last and
    `in_flight` requests in flight (None: more at each probe than ever before)."""
    for _ in range(round(seconds / PROBE_S)):
        for _ in range(arrivals):
            gate.admits(2)
        clock.advance(PROBE_S)
        cpu.seconds += busy * 0.25 * PROBE_S
        gate.observe(delay_s, next(_CLIMBING) if in_flight is None else in_flight)


def test_auto_admits_a_share_of_requests_while_they_keep_the_cpu_busier_than_max_cpu_busy() -> None:
    """Read every CUT_S, not each window: a saturated CPU with the loop falling behind halves the
    share at once (what is asked of it is unknown), a CPU just past the target cuts it by as much;
    it grows back a quarter a window once the CPU has room and the loop keeps up. The quota is
    what the worker may use."""
    clock = SteppedClock()
    cpu = Cpu(clock, cores=0.25)
    gate, _ = admission("max_cpu_busy: 0.8", clock, cpu)
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5)
    assert gate.share == 1.0  # behind at one reading: a stall, maybe
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5)
    assert gate.share == 0.5 and gate.limit == 10_000  # the loop only a fifth of its target late: the CPU said it
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5)
    assert gate.share == 0.25
    run_busy(gate, clock, cpu, CUT_S, busy=0.9, arrivals=5)
    assert gate.share == pytest.approx(0.25 * 0.8 / 0.9)
    run_busy(gate, clock, cpu, 2.0, busy=1.0, arrivals=5)
    assert gate.share == MIN_SHARE  # it still serves some
    told = [gate.admits(2) for _ in range(100)]
    assert told.count(True) == 100 * MIN_SHARE
    run_busy(gate, clock, cpu, 3 * WINDOW_S, busy=0.7, arrivals=5)  # room, but not enough: held
    assert gate.share == MIN_SHARE
    run_busy(gate, clock, cpu, 3 * WINDOW_S, busy=1.0, arrivals=5)
    run_busy(gate, clock, cpu, 3 * WINDOW_S, busy=0.5, arrivals=5, delay_s=0.008)  # room, the loop late: held
    assert gate.share == MIN_SHARE
    run_busy(gate, clock, cpu, 20 * WINDOW_S, busy=0.5, arrivals=5, delay_s=0.001)
    assert gate.share == 1.0


def test_a_saturated_cpu_whose_loop_keeps_up_admits_every_request() -> None:
    """A fixed number of clients, each sending again once answered, can saturate a worker's CPU
    without making a queue longer than they are: its loop keeps up, and it sheds nothing."""
    clock = SteppedClock()
    cpu = Cpu(clock, cores=0.25)
    gate, _ = admission("max_cpu_busy: 0.8", clock, cpu)
    run_busy(gate, clock, cpu, 2.0, busy=1.0, arrivals=5, delay_s=BEHIND_S * 0.9)
    assert gate.share == 1.0 and gate.busy == pytest.approx(1.0)
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5)  # one reading behind: a stall, not a queue
    assert gate.share == 1.0
    run_busy(gate, clock, cpu, 3 * CUT_S, busy=1.0, arrivals=5)  # a longer one: cut
    run_busy(gate, clock, cpu, WINDOW_S, busy=1.0, arrivals=5, delay_s=BEHIND_S * 0.4)
    cut = gate.share
    assert cut < 1.0
    run_busy(gate, clock, cpu, 5 * WINDOW_S, busy=1.0, arrivals=5, delay_s=BEHIND_S * 0.4)
    assert cut < gate.share <= cut * 1.06**5  # the CPU has no room, the loop keeps up: back slowly
    run_busy(gate, clock, cpu, 5.0, busy=1.0, arrivals=5, delay_s=BEHIND_S * 0.4)
    assert gate.share == 1.0  # and in the end wholly: the stall's cut does not last as long as the load


def test_a_closed_loop_whose_requests_in_flight_stay_level_is_not_cut_unless_the_loop_runs_far_behind() -> None:
    """A closed loop of clients saturating the CPU runs its loop as late as its clients times a
    request's cost: on a slow machine past BEHIND now and then, two readings running. With its
    requests in flight level (no more than it has clients) that is no overload; FAR times as late
    is, whatever is in flight. Once shedding, BEHIND alone goes on cutting: the cuts themselves
    hold what is in flight level."""
    clock = SteppedClock()
    cpu = Cpu(clock, cores=0.25)
    gate, _ = admission("max_cpu_busy: 0.8", clock, cpu)
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5, in_flight=64)
    run_busy(gate, clock, cpu, 3.0, busy=1.0, arrivals=5, delay_s=BEHIND_S * 1.5, in_flight=60)
    assert gate.share == 1.0
    run_busy(gate, clock, cpu, 2 * CUT_S, busy=1.0, arrivals=5, delay_s=BEHIND_S * FAR, in_flight=60)
    assert gate.share == 0.5
    run_busy(gate, clock, cpu, CUT_S, busy=1.0, arrivals=5, in_flight=60)
    assert gate.share == 0.25


def test_a_busy_cpu_with_few_arrivals_or_max_cpu_busy_1_admits_every_request() -> None:
    """A busy CPU the requests do not account for (fewer than MIN_CUT_ARRIVALS in CUT_S: a large
    body parsed, a reload) cuts nothing; nor does any CPU with `max_cpu_busy: 1`, or a fixed bound."""
    for server, arrivals in (("", (MIN_CUT_ARRIVALS - 1) // 3), ("max_cpu_busy: 1", 5), ("max_in_flight: 100", 5)):
        clock = SteppedClock()
        cpu = Cpu(clock, cores=0.25)
        gate, _ = admission(server, clock, cpu)
        run_busy(gate, clock, cpu, 1.0, busy=1.0, arrivals=arrivals)
        assert gate.share == 1.0, server
        assert gate.busy == pytest.approx(1.0)


def test_what_a_worker_may_use_is_its_share_of_the_cores_and_of_its_group_s_cpu_quota(tmp_path) -> None:
    proc = tmp_path / "cgroup"
    (tmp_path / "cpu" / "pods" / "a").mkdir(parents=True)
    (tmp_path / "cpu" / "pods" / "a" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "pods" / "a" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/pods/a\n2:cpu:/pods/a\n")
    assert quota_cores(proc, tmp_path) == 0.5  # cgroup v1
    (tmp_path / "cpu" / "pods" / "a" / "cpu.cfs_quota_us").write_text("-1\n")
    assert quota_cores(proc, tmp_path) is None  # no quota
    (tmp_path / "pods" / "b").mkdir(parents=True)
    (tmp_path / "pods" / "b" / "cpu.max").write_text("150000 100000\n")
    proc.write_text("0::/pods/b\n")
    assert quota_cores(proc, tmp_path) == 1.5  # cgroup v2
    (tmp_path / "pods" / "b" / "cpu.max").write_text("max 100000\n")
    assert quota_cores(proc, tmp_path) is None
    assert quota_cores(tmp_path / "absent", tmp_path) is None

    clock = SteppedClock()
    quota: list[float | None] = [1.5]
    cpu = WorkerCpu(2, quota=lambda: quota[0], clock=clock)
    cores = len(os.sched_getaffinity(0))
    assert cpu.available() == min(1.0, min(cores, 1.5) / 2)  # two workers share the quota
    quota[0] = 0.2
    assert cpu.available() == min(1.0, min(cores, 1.5) / 2)  # read again only after REREAD_S
    clock.advance(REREAD_S)
    assert cpu.available() == pytest.approx(0.1)
    quota[0] = None
    clock.advance(REREAD_S)
    assert cpu.available() == min(1.0, cores / 2)


def test_a_late_loop_with_few_arrivals_or_a_fixed_bound_admits_every_request() -> None:
    gate, clock = admission()
    busy_windows(gate, clock, 0.5, 2, arrivals=MIN_LIMIT - 1, count=3)  # a pause of the loop's own
    assert gate.share == 1.0
    fixed, clock = admission("max_in_flight: 100")
    busy_windows(fixed, clock, 0.5, 2, arrivals=50, count=3)
    assert fixed.share == 1.0 and all(fixed.admits(2) for _ in range(20))


async def test_while_shedding_a_loop_late_right_now_admits_next_to_nothing(clock: SteppedClock) -> None:
    """The window's median comes a window late; the probe's timer overdue says it now. Before a
    window has cut the share, an overdue timer alone refuses nothing (a collection, a large body)."""
    gate, clock = admission(clock=clock)
    gate.start(lambda: 2)  # the timer is due PROBE_S from the stepped clock's now, and never runs here
    try:
        clock.advance(PROBE_S + 0.05)  # overdue by 50 ms, five times the target
        assert all(gate.admits(2) for _ in range(100))
        gate.share = 0.5
        told = [gate.admits(2) for _ in range(100)]
        assert told.count(True) == 100 * MIN_SHARE
    finally:
        gate.stop()


def test_one_stall_of_the_loop_or_a_few_requests_in_flight_do_not_cut_the_bound() -> None:
    gate, clock = admission()
    for index in range(int(WINDOW_S / PROBE_S)):  # a reload's or a collection's pause in a quiet window
        clock.advance(PROBE_S)
        gate.observe(0.400 if index == 0 else 0.001, 500)
    assert gate.limit == 10_000
    windows(gate, clock, 0.5, MIN_LIMIT - 1, count=3)  # late with next to nothing in flight: not theirs
    assert gate.limit == 10_000
    clock.advance(1.0)
    gate.observe(0.5, 500)  # one probe over a long stretch is not a window either
    assert gate.limit == 10_000


def test_a_reload_keeps_what_auto_learnt_and_a_fixed_bound_takes_over() -> None:
    gate, clock = admission()
    windows(gate, clock, 0.040, 800)
    assert gate.limit == 400
    gate.configure(parse_config("server: {max_loop_delay_ms: 20}", {}).server)
    assert gate.limit == 400 and gate.target_s == 0.020
    gate.configure(parse_config("server: {max_in_flight: 64}", {}).server)
    assert gate.limit == 64 and not gate.auto


async def test_the_probe_measures_how_late_the_loop_runs() -> None:
    """Blocking the loop (as a flood of work would) shows as delay, and cuts the `auto` bound."""
    gate = Admission(parse_config("server: {max_loop_delay_ms: 5}", {}).server)
    gate.start(lambda: 1000)
    try:
        for _ in range(60):  # bounded: each pass blocks the loop 30 ms, then lets the probe run
            time.sleep(0.03)
            await asyncio.sleep(0)
            if gate.limit < 10_000:
                break
    finally:
        gate.stop()
    assert gate.delay_s >= 0.005 and gate.limit <= 900


async def test_check_config_names_a_bad_bound() -> None:
    from proxy.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config("server: {max_in_flight: none, listen_backlog: 0}\n", {})
    text = "\n".join(refused.value.problems)
    assert "server.max_in_flight: a number of requests (at least 1), or 'auto'" in text
    assert re.search(r"server\.listen_backlog: .*greater than or equal to 1", text)


async def test_a_worker_held_to_a_cpu_quota_sheds_as_its_cpu_fills(spawn) -> None:
    """A gateway process in a control group of its own, held to a tenth of a core by the kernel's
    CPU controller, offered far more than that serves: it reads its CPU as busy against that tenth
    (not against a core), refuses with 503 `overloaded`, answers every request, and says how busy
    it is on /metrics and in its refusals' log lines."""
    from bench.procs import CpuQuota

    gw = spawn(
        "gateway",
        config="""
        server: {listen: '127.0.0.1:{PORT}', max_cpu_busy: 0.8}
        observability: {logging: {access_log: false}}
    """,
    )
    try:
        quota = CpuQuota(gw.proc.pid, 0.1)
    except OSError as exc:  # not root, or no CPU controller: nothing to hold the process to
        pytest.skip(f"no CPU quota can be set here: {exc}")
    statuses: list[int] = []
    codes: set[str] = set()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:

            async def client() -> None:
                deadline = time.monotonic() + 4
                while time.monotonic() < deadline:
                    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MESSAGE_HEADERS) as answer:
                        statuses.append(answer.status)
                        if answer.status == 503:
                            assert answer.headers["Retry-After"] == "1"
                            codes.add((await answer.json())["error"]["code"])
                        else:
                            await answer.read()

            async def scrape() -> list[float]:  # while the load lasts: the gauge is the last tenth of a second's
                seen = []
                for _ in range(6):
                    await asyncio.sleep(0.5)
                    async with http.get(gw.admin + "/metrics") as answer:
                        gauge = re.search(r"^modelgate_cpu_busy_ratio (\S+)$", await answer.text(), re.M)
                        seen.append(float(gauge[1]) if gauge else 0.0)
                return seen

            *_, busy = await asyncio.gather(*(client() for _ in range(64)), scrape())
            async with http.get(gw.admin + "/metrics") as answer:
                metrics = await answer.text()
    finally:
        gw.proc.terminate()
        gw.proc.wait(30)
        quota.remove()
    assert set(statuses) == {200, 503} and codes == {"overloaded"}, (len(statuses), set(statuses), codes)
    assert max(busy) > 0.5, busy
    shed_total = sum(
        float(value)
        for value in re.findall(
            r'^modelgate_requests_shed_total\{[^}]*reason="overloaded"[^}]*\} (\S+)$', metrics, re.M
        )
    )
    assert shed_total == statuses.count(503)
    refusals = [json.loads(line) for line in gw.log.read_text().splitlines() if "refusing requests with 503" in line]
    assert refusals and max(line["cpu_busy"] for line in refusals) > 0.8
