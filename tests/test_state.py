"""State: the memory store (expiry, and a bound so a long-running gateway cannot grow without end), and
the gathering of Redis script calls (each caller hears its own call's answer)."""

from __future__ import annotations

import asyncio

from proxy.state.memory import MemoryStore


class FakePipeline:
    """A redis-py pipeline that records what it is sent, then answers `answers` (or raises `fails`)."""

    def __init__(self, answers: list[object], fails: Exception | None = None) -> None:
        self.answers, self.fails = answers, fails
        self.sent: list[tuple[object, ...]] = []

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


async def test_past_its_bound_the_oldest_entries_go_first():
    store = MemoryStore(max_items=3)
    for key in "abcd":
        await store.set(key, key.upper(), ttl_s=3600)
    assert [await store.get(k) for k in "abcd"] == [None, "B", "C", "D"]
    await store.set("b", "B2", ttl_s=3600)  # rewriting makes an entry the newest
    await store.set("e", "E", ttl_s=3600)
    assert [await store.get(k) for k in "bcde"] == ["B2", None, "D", "E"]


async def test_entries_expire(clock):  # noqa: ANN001
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

    class Client:
        gate = asyncio.Semaphore(4)
        pipelines: list[FakePipeline] = []

        def pipeline(self, transaction: bool) -> FakePipeline:
            self.pipelines.append(FakePipeline(["ran", NoScriptError("NOSCRIPT"), b"value"]))
            return self.pipelines[-1]

        async def script_load(self, text: str) -> None:
            raise RedisConnectionError("the server went away")

    client = Client()
    calls = Gatherer(client)
    acquire, finish = Script("acquire"), Script("finish")
    made_together = [calls.script(acquire, ["k"], [1]), calls.script(finish, ["k"], [2]), calls.command("GET", "x")]
    results = await asyncio.gather(*made_together, return_exceptions=True)
    assert results[0] == "ran" and isinstance(results[1], RedisConnectionError) and results[2] == b"value"
    assert len(client.pipelines) == 1, "calls made in one turn share one pipeline"
    assert client.pipelines[0].sent == [("EVALSHA", "acquire", 1, "k", 1), ("EVALSHA", "finish", 1, "k", 2),
                                        ("GET", "x")]


async def test_a_pipeline_of_reads_is_sent_again_when_its_connection_failed_but_never_one_with_a_script() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from proxy.state.gathering import Gatherer

    class Client:
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


async def test_a_large_write_goes_alone_and_holds_up_no_other_call() -> None:
    from proxy.state.gathering import Gatherer

    class Client:
        gate = asyncio.Semaphore(4)
        alone: list[object] = []

        def pipeline(self, transaction: bool) -> FakePipeline:
            return FakePipeline([b"a", b"b"])

    class Script:
        sha, script = "s", "-- s"

        async def __call__(self, keys: list[str], args: list[object]) -> str:
            Client.alone.append(args[0])
            return "stored"

    calls = Gatherer(Client())
    found = await asyncio.gather(calls.command("GET", "a"), calls.script(Script(), ["blob"], [b"x" * 10], alone=True),
                                 calls.command("GET", "b"))
    assert found == [b"a", "stored", b"b"] and Client.alone == [b"x" * 10]
