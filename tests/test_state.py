"""The memory state store: expiry, and a bound so a long-running gateway cannot grow without end."""

from __future__ import annotations

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
