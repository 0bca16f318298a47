"""State: the memory store (expiry, and a bound so a long-running gateway cannot grow without end), and
the gathering of Redis script calls (each caller hears its own call's answer)."""

from __future__ import annotations

import asyncio

from proxy.state.memory import MemoryStore


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

    from proxy.state.batching import ScriptBatcher

    class Script:
        def __init__(self, sha: str) -> None:
            self.sha, self.script = sha, f"-- {sha}"
            self.alone: asyncio.Future[str] | None = None

        async def __call__(self, keys: list[str], args: list[object]) -> str:
            self.alone = asyncio.get_running_loop().create_future()
            return await self.alone  # held, so the calls after it are gathered

    class Pipeline:
        def __init__(self, answers: list[object]) -> None:
            self.answers = answers

        async def __aenter__(self) -> Pipeline:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        def evalsha(self, *args: object) -> Pipeline:
            return self

        async def execute(self, raise_on_error: bool) -> list[object]:
            return self.answers

    class Client:
        gate = asyncio.Semaphore(4)

        def pipeline(self, transaction: bool) -> Pipeline:
            return Pipeline(["ran", NoScriptError("NOSCRIPT")])

        async def script_load(self, text: str) -> None:
            raise RedisConnectionError("the server went away")

    acquire, finish = Script("acquire"), Script("finish")
    batcher = ScriptBatcher(Client())
    alone = asyncio.ensure_future(batcher.run(acquire, ["k"], []))
    await asyncio.sleep(0)
    gathered = [asyncio.ensure_future(batcher.run(s, ["k"], [])) for s in (acquire, finish)]
    results = await asyncio.gather(*gathered, return_exceptions=True)
    assert results[0] == "ran" and isinstance(results[1], RedisConnectionError)
    assert acquire.alone is not None
    acquire.alone.set_result("alone")
    assert await alone == "alone"
