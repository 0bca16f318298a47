"""State: the memory store (expiry, and a bound so a long-running gateway cannot grow without end), and
the gathering of Redis script calls (each caller hears its own call's answer), and commands packed
to the bytes redis-py itself would send."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.state.memory import MemoryStore


class FakePipeline:
    """A redis-py pipeline that records what it is sent, then answers `answers` (or raises `fails`)."""

    def __init__(self, answers: list[object], fails: Exception | None = None) -> None:
        self.answers, self.fails = answers, fails
        self.sent: list[tuple[object, ...]] = []
        self.writes: list[list[tuple[object, ...]]] = []  # what each write on the connection held

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def evalsha(self, *args: object) -> FakePipeline:
        self.sent.append(("EVALSHA", *args))
        return self

    def execute_command(self, *args: object) -> FakePipeline:
        self.sent.append(args)
        return self

    async def execute(self, raise_on_error: bool) -> list[object]:
        if self.fails is not None:
            raise self.fails
        return self.answers


class FakeConnection:
    """A connection the gathering sends a pipeline's commands on, answering as `pipeline` says:
    its commands are recorded there, and an error answer is raised as a real connection raises it."""

    def __init__(self, pipeline: FakePipeline) -> None:
        self.pipeline = pipeline
        self.unread = list(pipeline.answers)

    async def send_packed_command(self, packed: bytes, check_health: bool = True) -> None:
        import hiredis

        reader = hiredis.Reader()
        reader.feed(packed)
        self.pipeline.writes.append([])
        while (command := reader.gets()) is not False:  # recorded as sent, numbers read back as numbers
            self.pipeline.sent.append(tuple(int(p) if p.isdigit() else p.decode() for p in command))
            self.pipeline.writes[-1].append(self.pipeline.sent[-1])
        if self.pipeline.fails is not None:
            raise self.pipeline.fails

    socket_timeout = 5.0

    async def exchange(self, packed: bytes, count: int) -> list[object]:  # as proxy/state/packing.py's
        from redis.exceptions import ResponseError

        await self.send_packed_command(packed)
        answers: list[object] = []
        for _ in range(count):
            try:
                answers.append(await self.read_response())
            except ResponseError as exc:
                answers.append(exc)
        return answers

    async def can_read(self) -> bool:  # a kept connection is checked before it is used again
        return False

    async def read_response(self, timeout: float | None = None) -> object:
        answer = self.unread.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def disconnect(self, nowait: bool = False) -> None:
        return None


class FakeClient:
    """A client whose pool hands out one FakeConnection a pipeline (`pipeline`, which each test's
    client answers)."""

    response_callbacks: dict[str, object] = {}

    def pipeline(self, transaction: bool) -> FakePipeline:
        raise NotImplementedError

    @property
    def connection_pool(self) -> object:
        client = self

        class Pool:
            async def get_connection(self) -> FakeConnection:
                return FakeConnection(client.pipeline(False))

            async def release(self, connection: FakeConnection) -> None:
                return None

            async def disconnect(self) -> None:
                return None

        return Pool()


async def test_past_its_bound_the_oldest_entries_go_first():
    store = MemoryStore(max_items=3)
    for key in "abcd":
        await store.set(key, key.upper(), ttl_s=3600)
    assert [await store.get(k) for k in "abcd"] == [None, "B", "C", "D"]
    await store.set("b", "B2", ttl_s=3600)  # rewriting makes an entry the newest
    await store.set("e", "E", ttl_s=3600)
    assert [await store.get(k) for k in "bcde"] == ["B2", None, "D", "E"]


async def test_entries_expire(clock):
    store = MemoryStore(clock=clock)
    await store.set("short", "x", ttl_s=1)
    clock.advance(0.99)
    assert await store.get("short") == "x"
    clock.advance(0.02)
    assert await store.get("short") is None


async def test_a_gathered_call_that_ran_hears_its_own_answer_though_a_forgotten_script_then_fails() -> None:
    """Of a pipeline whose second call met NOSCRIPT, the first call ran: when the reload then fails,
    only the second call's caller hears of it (the first must not be told its lease was not taken)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError

    from proxy.state.gathering import Gatherer

    class Script:
        def __init__(self, sha: str) -> None:
            self.sha, self.script = sha, f"-- {sha}"

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)
        pipelines: list[FakePipeline] = []

        def pipeline(self, transaction: bool) -> FakePipeline:  # then the reload, as the server goes away
            self.pipelines.append(
                FakePipeline(["ran", NoScriptError("NOSCRIPT"), b"value", RedisConnectionError("the server went away")])
            )
            return self.pipelines[-1]

    client = Client()
    calls = Gatherer(client)
    acquire, finish = Script("acquire"), Script("finish")
    made_together = [calls.script(acquire, ["k"], [1]), calls.script(finish, ["k"], [2]), calls.command("GET", "x")]
    results = await asyncio.gather(*made_together, return_exceptions=True)
    assert results[0] == "ran" and isinstance(results[1], RedisConnectionError) and results[2] == b"value"
    first, reload = client.pipelines[0].writes
    assert first == [("EVALSHA", "acquire", 1, "k", 1), ("EVALSHA", "finish", 1, "k", 2), ("GET", "x")], (
        "calls made in one turn share one pipeline"
    )
    assert reload == [("SCRIPT", "LOAD", "-- finish"), ("EVALSHA", "finish", 1, "k", 2)], (
        "the script is loaded on the connection that sends its call again"
    )


async def test_a_forgotten_script_redis_will_not_load_fails_its_own_calls_only() -> None:
    """Two scripts Redis forgot, reloaded together: the one that does not compile fails its own
    call with the reason; the other's call, which ran, hears its own answer."""
    from redis.exceptions import NoScriptError, ResponseError

    from proxy.state.gathering import Gatherer

    class Script:
        def __init__(self, sha: str) -> None:
            self.sha, self.script = sha, f"-- {sha}"

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)

        def pipeline(self, transaction: bool) -> FakePipeline:  # then: its load, the other's, their calls again
            return FakePipeline(
                [
                    NoScriptError("NOSCRIPT"),
                    NoScriptError("NOSCRIPT"),
                    "good",
                    ResponseError("Error compiling script"),
                    "ran",
                    NoScriptError("NOSCRIPT"),
                ]
            )

    calls = Gatherer(Client())
    good, broken = Script("good"), Script("broken")
    results = await asyncio.gather(
        calls.script(good, ["k"], [1]), calls.script(broken, ["k"], [2]), return_exceptions=True
    )
    assert results[0] == "ran"
    assert isinstance(results[1], ResponseError) and "compiling" in str(results[1])


class PooledClient(FakeClient):
    """A client whose pool hands out what `connect` makes, and gives each back to `released`."""

    def __init__(self, connect: Any, released: Any = lambda connection: None) -> None:
        self.gate = asyncio.Semaphore(4)
        self._connect, self._released = connect, released

    @property
    def connection_pool(self) -> object:
        client = self

        class Pool:
            async def get_connection(self) -> FakeConnection:
                return await client._connect()

            async def release(self, connection: FakeConnection) -> None:
                client._released(connection)

        return Pool()


async def test_a_connection_that_fails_to_close_still_gives_its_slot_back() -> None:
    """A stalled Redis: closing the connection raises too (its buffer never drains), and the pool's
    slot must come back all the same, or each such failure costs one for good."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from proxy.state.gathering import Gatherer

    released: list[object] = []

    class Stuck(FakeConnection):
        async def disconnect(self, nowait: bool = False) -> None:
            raise TimeoutError("Timed out closing connection")

    async def stuck() -> FakeConnection:
        return Stuck(FakePipeline([RedisConnectionError("reset")]))

    calls = Gatherer(PooledClient(stuck, released.append))
    with pytest.raises(RedisConnectionError):
        await calls.command("GET", "x", resend=False)
    assert len(released) == 1


async def test_a_call_that_timed_out_unsent_is_never_sent_but_one_whose_caller_left_is() -> None:
    """A stalled Redis holds the connection a turn's pipeline waits for. A call whose caller was told
    it timed out unsent (so never ran, and may be counted elsewhere) must not run later; a call
    whose caller was cancelled (its client went away) still makes the write it started."""
    from proxy.state.gathering import Gatherer, answer_within

    ready = asyncio.Event()
    pipeline = FakePipeline([b"kept"])

    async def handshake() -> FakeConnection:
        await ready.wait()  # a new connection's, which the stalled Redis answers late
        return FakeConnection(pipeline)

    class Script:
        sha, script = "s", "-- s"

    calls = Gatherer(PooledClient(handshake))
    expiring, receipt = calls.script_with_receipt(Script(), ["reserved"], [])
    leaving = calls.command("SET", "pin", "x")
    left = asyncio.ensure_future(leaving)
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        await answer_within(expiring, 0.01)
    left.cancel()
    assert not receipt.sent
    ready.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert pipeline.sent == [("SET", "pin", "x")]


async def test_a_pipeline_of_reads_is_sent_again_when_its_connection_failed_but_never_one_with_a_script() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from proxy.state.gathering import Gatherer

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)
        sent = 0

        def pipeline(self, transaction: bool) -> FakePipeline:
            self.sent += 1
            return FakePipeline([b"a", b"b"], RedisConnectionError("reset by peer") if self.sent == 1 else None)

    class Script:
        sha, script = "s", "-- s"

    reads = Client()
    calls = Gatherer(reads)
    assert await asyncio.gather(calls.command("GET", "a"), calls.command("GET", "b")) == [b"a", b"b"]
    assert reads.sent == 2
    scripted = Client()
    calls = Gatherer(scripted)
    found = await asyncio.gather(calls.command("GET", "a"), calls.script(Script(), ["k"], []), return_exceptions=True)
    assert found[0] == b"a", "the read is sent again, alone"
    assert isinstance(found[1], RedisConnectionError), "the script may have run: its caller hears the failure"
    assert scripted.sent == 2


async def test_a_connection_that_failed_takes_the_kept_ones_with_it() -> None:
    """The gatherer keeps the connections its pipelines ran on; one failing (a Redis restarted)
    drops them all, as stale as it, rather than meeting each in turn on later requests."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from proxy.state.gathering import Gatherer

    made: list[Slow] = []

    class Slow(FakeConnection):
        dropped = False

        async def read_response(self, timeout: float | None = None) -> object:
            await asyncio.sleep(0.01)  # pipelines overlap: each gets a connection of its own
            return await super().read_response()

        async def disconnect(self, nowait: bool = False) -> None:
            self.dropped = True

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)

        def pipeline(self, transaction: bool) -> FakePipeline:
            return FakePipeline([b"a", b"b"])

        @property
        def connection_pool(self) -> object:
            client = self

            class Pool:
                async def get_connection(self) -> Slow:
                    made.append(Slow(client.pipeline(False)))
                    return made[-1]

                async def release(self, connection: Slow) -> None:
                    return None

            return Pool()

    client = Client()
    calls = Gatherer(client)

    async def turn() -> list[object]:
        return await asyncio.gather(calls.command("GET", "a"), calls.command("GET", "b"))

    first = asyncio.ensure_future(turn())
    await asyncio.sleep(0)  # the first turn's pipeline is under way when the second's is sent
    assert await asyncio.gather(first, turn()) == [[b"a", b"b"]] * 2
    assert len(made) == 2 and not any(c.dropped for c in made)  # both kept
    for connection in made:  # Redis restarted: the kept connections are dead
        connection.pipeline.fails = RedisConnectionError("reset")
    assert await turn() == [b"a", b"b"]  # sent again, on a connection of the pool's
    assert len(made) == 3 and all(c.dropped for c in made[:2]) and not made[2].dropped


async def test_a_large_write_goes_alone_and_holds_up_no_other_call() -> None:
    from proxy.state.gathering import Gatherer

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)
        pipelines: list[FakePipeline] = []

        def pipeline(self, transaction: bool) -> FakePipeline:  # the large write's goes first, at once
            self.pipelines.append(FakePipeline(["stored", b"a", b"b"]))
            return self.pipelines[-1]

    class Script:
        sha, script = "s", "-- s"

    client = Client()
    calls = Gatherer(client)
    found = await asyncio.gather(
        calls.command("GET", "a"), calls.script(Script(), ["blob"], [b"x" * 10], alone=True), calls.command("GET", "b")
    )
    assert found == [b"a", "stored", b"b"]
    assert client.pipelines[0].writes == [[("EVALSHA", "s", 1, "blob", "x" * 10)], [("GET", "a"), ("GET", "b")]]


async def test_a_call_made_as_the_turn_s_pipeline_is_sent_goes_in_it() -> None:
    """at_flush: a user that makes one call of many small writes (the ledger's journal) makes it
    as the turn's calls are sent, with them, however late in the turn its first write came."""
    from proxy.state.gathering import Gatherer

    class Client(FakeClient):
        gate = asyncio.Semaphore(4)
        pipelines: list[FakePipeline] = []

        def pipeline(self, transaction: bool) -> FakePipeline:
            self.pipelines.append(FakePipeline([b"a", b"b", 2]))
            return self.pipelines[-1]

    client = Client()
    calls = Gatherer(client)
    batch: list[str] = []
    made: list[asyncio.Future[object]] = []

    def write(value: str) -> None:
        if not batch:
            calls.at_flush(lambda: made.append(calls.command("RPUSH", "list", *batch)))
        batch.append(value)

    first = calls.command("GET", "a")
    write("x")
    write("y")
    last = calls.command("GET", "b")
    assert await asyncio.gather(first, last) == [b"a", b"b"] and await made[0] == 2
    assert [p.sent for p in client.pipelines] == [[("GET", "a"), ("GET", "b"), ("RPUSH", "list", "x", "y")]]

    class Cluster:  # nothing gathered: the call is made soon, and goes alone
        sent: list[tuple[object, ...]] = []

        async def execute_command(self, *args: object) -> int:
            self.sent.append(args)
            return 1

    cluster = Cluster()
    calls, batch, made = Gatherer(cluster, gathers=False), [], []
    write("z")
    await asyncio.sleep(0)
    assert await made[0] == 1 and cluster.sent == [("RPUSH", "list", "z")]


_ARGUMENT = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.binary().map(memoryview),
)


@given(st.sampled_from(["SET", "EVALSHA", "CONFIG GET", b"CLIENT SETNAME", b"GET"]), st.lists(_ARGUMENT, max_size=24))
def test_commands_are_packed_to_the_very_bytes_redis_py_packs(command: str | bytes, args: list[object]) -> None:
    from redis.asyncio.connection import Connection

    from proxy.state.packing import packing_with_hiredis

    reference, packing = Connection(), packing_with_hiredis(Connection)()
    expected = b"".join(bytes(piece) for piece in reference.pack_command(command, *args))
    assert b"".join(packing.pack_command(command, *args)) == expected


def test_what_cannot_be_packed_is_refused_with_a_redis_error_before_anything_is_sent() -> None:
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from proxy.state.packing import packing_with_hiredis

    reference, packing = Connection(), packing_with_hiredis(Connection)()
    for bad in (None, True, ["a"], {"a": 1}):
        with pytest.raises(DataError):
            reference.pack_command("SET", "k", bad)
        with pytest.raises(DataError):
            packing.pack_command("SET", "k", bad)
    with pytest.raises(UnicodeEncodeError):  # a header's undecodable byte, as aiohttp hands it over
        reference.pack_command("GET", "ip:\udcff")
    with pytest.raises(DataError):  # a RedisError, which every caller meets as Redis refusing
        packing.pack_command("GET", "ip:\udcff")


def test_every_topology_s_connections_pack_with_hiredis() -> None:
    from proxy.state.connect import connect
    from proxy.state.packing import HiredisPacking

    for url in (
        "redis://127.0.0.1:6379/0",
        "rediss://127.0.0.1:6379/0",
        "unix:///tmp/redis.sock",
        "redis+sentinel://127.0.0.1:26379/primary/0",
        "rediss+sentinel://127.0.0.1:26379/primary/0",
    ):
        assert issubclass(connect(url).connection_pool.connection_class, HiredisPacking), url
    for url in ("redis+cluster://127.0.0.1:7000", "rediss+cluster://127.0.0.1:7000"):
        assert issubclass(connect(url).connection_kwargs["connection_class"], HiredisPacking), url


async def test_a_call_that_cannot_be_packed_fails_alone_though_it_was_gathered_with_others(redis_url: str) -> None:
    """A string UTF-8 cannot hold fails its pipeline before a byte is sent: the calls gathered
    with it are then sent each on its own, and only the bad one hears of it."""
    from redis.exceptions import DataError

    from proxy.state.shared import share, unshare

    shared = share(redis_url)
    try:
        calls = shared.calls
        await calls.command("SET", "gathered:good", "yes")
        script = shared.client.register_script("return redis.call('INCR', KEYS[1])")
        found = await asyncio.gather(
            calls.command("GET", "gathered:good"),
            calls.command("GET", "ip:\udcff"),
            calls.script(script, ["gathered:count"], []),
            return_exceptions=True,
        )
        assert found[0] == b"yes" and isinstance(found[1], DataError) and found[2] == 1
        assert await calls.command("GET", "gathered:count") == b"1", "the script ran once"
    finally:
        await unshare(shared)
