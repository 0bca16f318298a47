"""Affinity: task and response ids lead back to the channel that made them, from any gateway instance."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.conftest import BEARER

TWO_UPSTREAMS = """
server: {{listen: "127.0.0.1:{{PORT}}"}}
state: {{backend: {backend}, url: "{redis}"}}
observability: {{logging: {{access_log: false}}}}
channels:
  - {{name: one, base_url: "{one}", credential: key-one}}
  - {{name: two, base_url: "{two}", credential: key-two}}
"""


@pytest.fixture
def pair(spawn, shared_redis):
    """Gateways A and B sharing one Redis (in each topology), in front of two upstreams that each know only their own ids."""
    one = spawn(
        "simulator",
        "--key",
        "key-one",
        "--video-queued-s",
        "0.2",
        "--video-processing-s",
        "0.3",
        "--chunk-delay-ms",
        "0",
        "--name",
        "one",
    )
    two = spawn(
        "simulator",
        "--key",
        "key-two",
        "--video-queued-s",
        "0.2",
        "--video-processing-s",
        "0.3",
        "--chunk-delay-ms",
        "0",
        "--name",
        "two",
    )
    config = TWO_UPSTREAMS.format(backend="redis", redis=shared_redis, one=one.url, two=two.url)
    return spawn("gateway", config=config), spawn("gateway", config=config), {"one": one, "two": two}


@pytest.mark.parametrize("shared_redis", ["single"], indirect=True)  # the other topologies: the chain below
async def test_video_task_made_through_a_is_polled_and_downloaded_through_b(pair):
    a, b, upstreams = pair
    async with aiohttp.ClientSession() as http:
        tasks = []
        for _ in range(8):  # with two channels, a lost pin would fail half of these
            async with http.post(
                a.url + "/v1/video/generations",
                headers=BEARER,
                json={"model": "videogen-3.0-generate-001", "prompt": "waves"},
            ) as answer:
                assert answer.status == 200
                tasks.append((await answer.json())["task_id"])
        for task_id in tasks:
            status = await poll_until_done(http, b.url, task_id)
            assert status["data"]["status"] == "succeeded"
            owner = "one" if "_one_" in task_id else "two"
            async with http.get(
                f"{upstreams[owner].url}/v1/videos/{task_id}/content", headers={"Authorization": f"Bearer key-{owner}"}
            ) as direct:
                original = await direct.read()
            async with http.get(f"{b.url}/v1/videos/{task_id}/content", headers=BEARER) as answer:
                assert answer.status == 200 and await answer.read() == original
            async with http.get(
                f"{a.url}/v1/videos/{task_id}/content", headers={**BEARER, "Range": "bytes=1000-2999"}
            ) as answer:
                assert answer.status == 206
                assert answer.headers["Content-Range"] == f"bytes 1000-2999/{len(original)}"
                assert await answer.read() == original[1000:3000]
            async with http.head(f"{b.url}/v1/videos/{task_id}/content", headers=BEARER) as answer:
                assert answer.status == 200 and int(answer.headers["Content-Length"]) == len(original)
                assert answer.headers["Content-Type"] == "video/mp4"


async def poll_until_done(http: aiohttp.ClientSession, url: str, task_id: str) -> dict:
    for _ in range(100):
        async with http.get(f"{url}/v1/video/generations/{task_id}", headers=BEARER) as answer:
            assert answer.status == 200, await answer.text()
            status = await answer.json()
        if status["data"]["status"] in ("succeeded", "failed"):
            return status
        await asyncio.sleep(0.1)
    raise AssertionError("the task never finished")


@pytest.mark.parametrize(
    ("shared_redis", "stream"),
    [("single", False), ("single", True), ("cluster", False), ("sentinel", False)],
    indirect=["shared_redis"],
)
async def test_previous_response_id_chains_across_a_and_b(pair, stream):
    a, b, _ = pair
    async with aiohttp.ClientSession() as http:
        for chain in range(4):
            previous = None
            for turn, gateway in enumerate([a, b, a, b], start=1):
                body = {
                    "model": "respmodel-4o",
                    "input": f"turn {turn}",
                    "stream": stream,
                    "previous_response_id": previous,
                }
                async with http.post(gateway.url + "/v1/responses", json=body, headers=BEARER) as answer:
                    assert answer.status == 200, await answer.text()
                    previous, text = await response_id_and_text(answer, stream)
                assert text.startswith(f"Turn {turn}:"), (chain, turn, text)


async def response_id_and_text(answer: aiohttp.ClientResponse, stream: bool) -> tuple[str, str]:
    if not stream:
        body = await answer.json()
        return body["id"], body["output"][0]["content"][0]["text"]
    import json

    final = None
    for block in (await answer.text()).split("\n\n"):
        if block.startswith("event: response.completed"):
            final = json.loads(block.split("data: ", 1)[1])["response"]
    assert final is not None
    return final["id"], final["output"][0]["content"][0]["text"]


async def test_memory_state_pins_within_one_gateway(start_gateway, http):
    gw = await start_gateway("""
        channels:
          - {name: one, base_url: simulator}
          - {name: two, base_url: simulator}
    """)
    previous = None
    for turn in range(1, 9):
        body = {"model": "respmodel-4o", "input": "x", "previous_response_id": previous}
        async with http.post(gw.url + "/v1/responses", json=body, headers=BEARER) as answer:
            assert answer.status == 200
            data = await answer.json()
        previous = data["id"]
        assert data["output"][0]["content"][0]["text"].startswith(f"Turn {turn}:")


async def test_an_id_longer_than_any_handed_out_is_not_found_without_a_lookup(start_gateway, http) -> None:
    """Ids over 512 characters are never handed out: following one is the format's 404 at once,
    not a key of megabytes sent to the state store."""
    from proxy.request.affinity import Affinity
    from proxy.wire.routes import Pin

    class Untouchable:
        async def get(self, key: str) -> str | None:
            raise AssertionError("looked up")

    assert await Affinity(Untouchable(), 60)._record_of(Pin.RESPONSE, "r" * 513, "request") is None  # type: ignore[arg-type]
    gateway = await start_gateway()
    async with http.post(
        gateway.url + "/v1/responses",
        headers=BEARER,
        json={"model": "respmodel-4o", "input": "x", "previous_response_id": "resp_" + "r" * 100_000},
    ) as answer:
        assert answer.status == 404 and (await answer.json())["error"]["code"] == "previous_response_not_found"
