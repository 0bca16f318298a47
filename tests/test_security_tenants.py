"""Tenants are isolated: what one key made, no other tenant can reach, on one instance or three.
(docs/security.md; each numbered case is an attack that once worked, replayed through real sockets
against an upstream that records the exact request line it was sent.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy.request.target import PARAM_GRAMMAR
from tests.raw_http import Received, json_answer, recording_upstream, send_raw
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    ALICE_TOO,
    BOB,
    CONTENT,
    LIMITED,
    SECRET,
    TENANTS,
    VIDEO,
    bearer,
    config,
    get,
    gw,
    post,
    submit,
    upstream,
)


async def test_4_a_video_task_is_its_tenants_alone(gw, upstream):
    await submit(gw.url, ALICE, "task_alice_1")
    paths = ("/v1/video/generations/{}", "/v1/videos/{}", "/v1/videos/{}/content")
    never = {p: await get(gw.url, p.format("task_never_made"), BOB) for p in paths}
    asked = len(upstream[1])
    for path, unknown in never.items():
        stolen = await get(gw.url, path.format("task_alice_1"), BOB)
        assert stolen.status == unknown.status == 404
        assert stolen.json() == unknown.json()  # as if the id did not exist
    assert len(upstream[1]) == asked  # nothing of bob's reached the channel
    for path in paths:  # the same tenant reaches it: a status, or a download not ready yet
        assert (await get(gw.url, path.format("task_alice_1"), ALICE_TOO)).status in (200, 409)
        assert (await get(gw.url, path.format("task_alice_1"), ALICE)).status in (200, 409)
    assert len(upstream[1]) > asked  # and the owners' polls did reach it


@pytest.fixture(params=["memory", "redis"])
async def gw_state(request, start_gateway, upstream):
    """The gateway with state in memory, or in Redis (where lookups are tasks that share round trips)."""
    if request.param == "memory":
        return await start_gateway(config(upstream[0].url))
    url = await _redis_url()
    return await start_gateway(config(upstream[0].url, f'state: {{backend: redis, url: "{url}"}}'))


async def _redis_url() -> str:
    from tests.conftest import _emptied_test_database

    return await _emptied_test_database()


async def test_4_a_status_its_owner_polled_is_not_shown_to_another_tenant(gw_state, upstream):
    """The cached status is read with the task's record, before the owner is known; it is used only
    after the core has said the task is the caller's."""
    gw = gw_state
    await submit(gw.url, ALICE, "task_alice_cached")
    for path in ("/v1/video/generations/{}", "/v1/videos/{}"):
        assert (await get(gw.url, path.format("task_alice_cached"), ALICE)).status == 200  # now cached
    asked = len(upstream[1])
    for path in ("/v1/video/generations/{}", "/v1/videos/{}", "/v1/videos/{}/content"):
        stolen = await get(gw.url, path.format("task_alice_cached"), BOB)
        unknown = await get(gw.url, path.format("task_never_made"), BOB)
        assert stolen.status == unknown.status == 404 and stolen.json() == unknown.json()
        assert b"task_alice_cached" not in stolen.body
    assert len(upstream[1]) == asked


async def test_4_an_upstream_id_made_twice_keeps_its_first_tenants_record(gw_state, upstream):
    """A task's record is written with its pin, and only if the pin is the request's: the second
    tenant to be handed the same upstream id gets an alias, and the first one's record stands."""
    gw = gw_state
    mine = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(ALICE)}X-Test-Task: task_twice\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"alice-prompt"}',
        ),
    )
    theirs = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(BOB)}X-Test-Task: task_twice\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"bob-secret"}',
        ),
    )
    assert mine.status == theirs.status == 200, (mine.body, theirs.body)
    assert mine.json()["id"] == "task_twice" and theirs.json()["id"].startswith("task_mg_")
    seen = await get(gw.url, "/v1/videos/task_twice", ALICE)
    assert seen.status == 200 and seen.json()["prompt"] == "alice-prompt", seen.body
    listed = await get(gw.url, "/v1/videos", ALICE)
    assert [v["id"] for v in listed.json()["data"]] == ["task_twice"] and b"bob-secret" not in listed.body
    bobs = await get(gw.url, "/v1/videos", BOB)
    assert [(v["id"], v["prompt"]) for v in bobs.json()["data"]] == [(theirs.json()["id"], "bob-secret")]


async def test_4_an_id_handed_to_another_tenant_after_its_pin_lapsed_leaves_the_first_ones_list(
    start_gateway, upstream
):
    """The list is the tenant's own, but an id on it may be handed to another tenant once its pin
    has lapsed and the upstream gives the id again: the record names its owner, and the list
    shows only the caller's."""
    import redis.asyncio as aioredis

    url = await _redis_url()
    gw = await start_gateway(config(upstream[0].url, f'state: {{backend: redis, url: "{url}"}}'))
    first = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(ALICE)}X-Test-Task: task_again\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"alice-prompt"}',
        ),
    )
    assert first.status == 200 and first.json()["id"] == "task_again"
    client = aioredis.Redis.from_url(url)
    try:
        assert await client.delete("modelgate:pin:video:task_again") == 1  # its week is over
    finally:
        await client.aclose()
    again = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(BOB)}X-Test-Task: task_again\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"bob-secret"}',
        ),
    )
    assert again.status == 200 and again.json()["id"] == "task_again"  # free again: handed out as it is
    alices = await get(gw.url, "/v1/videos", ALICE)
    assert alices.status == 200 and alices.json()["data"] == [] and b"bob-secret" not in alices.body
    bobs = await get(gw.url, "/v1/videos", BOB)
    assert [(v["id"], v["prompt"]) for v in bobs.json()["data"]] == [("task_again", "bob-secret")]


async def test_4_a_bad_key_following_an_id_hears_of_its_key_first(gw_state, upstream):
    gw = gw_state
    await submit(gw.url, ALICE, "task_alice_2")
    for key in ("mg-not-a-key", ""):
        answer = (
            await get(gw.url, "/v1/video/generations/task_alice_2", key)
            if key
            else await send_raw(gw.url, b"GET /v1/video/generations/task_alice_2 HTTP/1.1")
        )
        assert answer.status == 401, answer.body


async def test_4_a_plugin_sees_another_tenants_id_only_if_it_says_it_reads_nothing_of_it(start_gateway, upstream):
    """A third-party plugin, written for "runs after auth", runs after the owner check too: only
    auth, validation and the limits run before it (they declare `before_owner_check`)."""
    from tests.recording_plugin import Recorder

    recorder = "tests.recording_plugin:Recorder"
    gw = await start_gateway(
        config(
            upstream[0].url,
            f"""routes:
  video_generation_status: {{plugins: [auth, validation, ratelimit, {recorder}, video]}}
  responses: {{plugins: [auth, validation, ratelimit, {recorder}]}}
""",
        )
    )
    await submit(gw.url, ALICE, "task_alice_seen")
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": made.json()["id"]}).encode()
    Recorder.requested.clear()
    assert (await get(gw.url, "/v1/video/generations/task_alice_seen", BOB)).status == 404
    assert (await send_raw(gw.url, *post("/v1/responses", bearer(BOB), follow))).status == 404
    assert Recorder.requested == []
    assert (await get(gw.url, "/v1/video/generations/task_alice_seen", ALICE_TOO)).status == 200
    assert Recorder.requested == [("alice-too", "task_alice_seen")]


def test_4_a_plugin_that_may_read_a_followed_id_cannot_run_before_the_caller_is_known() -> None:
    from proxy.registry import order_problems
    from proxy.wire.routes import ROUTES

    route = next(r for r in ROUTES if r.name == "responses")
    problems = order_problems(route, ["tests.recording_plugin:Recorder", "auth"], "routes.responses.plugins")
    assert problems and "must come after auth" in problems[0]
    assert order_problems(route, ["auth", "tests.recording_plugin:Recorder"], "routes.responses.plugins") == []
    assert order_problems(route, ["validation", "auth"], "routes.responses.plugins") == []  # reads nothing of the id


async def test_4_a_previous_response_is_its_tenants_alone(gw, upstream):
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"secret"}'))
    response_id = made.json()["id"]
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": response_id}).encode()
    never = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": "resp_never"}).encode()
    asked = len(upstream[1])
    stolen = await send_raw(gw.url, *post("/v1/responses", bearer(BOB), follow))
    unknown = await send_raw(gw.url, *post("/v1/responses", bearer(BOB), never))
    assert stolen.status == unknown.status == 404 and stolen.json() == unknown.json()
    assert stolen.json()["error"]["code"] == "previous_response_not_found"
    assert len(upstream[1]) == asked
    assert (await send_raw(gw.url, *post("/v1/responses", bearer(ALICE_TOO), follow))).status == 200


@pytest.fixture
def three(spawn, shared_redis):
    sim = spawn(
        "simulator", "--key", SECRET, "--video-queued-s", "0", "--video-processing-s", "0.2", "--chunk-delay-ms", "0"
    )
    limited = f"{{name: limited, key: {LIMITED}, limits: {{rpm: 30, concurrent: 2}}}}"
    keys = TENANTS + f"\n  - {limited}"
    text = f'server: {{listen: "127.0.0.1:{{PORT}}"}}\nstate: {{backend: redis, url: "{shared_redis}"}}\n' + config(
        sim.url, keys=keys
    ).replace("observability: {logging: {access_log: false}}", "")
    return [spawn("gateway", config=text) for _ in range(3)]


async def test_tenants_stay_apart_across_three_instances(three):
    a, b, c = (g.url for g in three)
    made = await send_raw(a, *post("/v1/video/generations", bearer(ALICE), VIDEO))
    task = made.json()["task_id"]
    response = (
        await send_raw(b, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x","store":true}'))
    ).json()["id"]
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": response}).encode()
    for url in (a, b, c):
        assert (await get(url, f"/v1/video/generations/{task}", BOB)).status == 404
        assert (await get(url, f"/v1/videos/{task}/content", BOB)).status == 404
        assert (await send_raw(url, *post("/v1/responses", bearer(BOB), follow))).status == 404
        assert (await get(url, f"/v1/video/generations/{task}", ALICE_TOO)).status == 200
        assert (await send_raw(url, *post("/v1/responses", bearer(ALICE_TOO), follow))).status == 200


@pytest.mark.parametrize("shared_redis", ["single"], indirect=True)  # across topologies: tests/test_ratelimit.py
async def test_limits_hold_across_three_instances_whatever_request_id_is_repeated(three):
    urls = [g.url for g in three]
    same_id = "X-Request-Id: one-id-for-everything\r\n"
    target = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={LIMITED}"
    slow = f"{same_id}x-sim-chunk-delay-ms: 400\r\nx-sim-output-tokens: 5\r\n"
    streams = await asyncio.gather(
        *(
            send_raw(
                urls[i % 3],
                *post(target.replace(":generate", ":streamGenerate") + "&alt=sse", slow, CONTENT),
                timeout=20,
            )
            for i in range(6)
        )
    )
    assert sorted(s.status for s in streams) == [200, 200, 429, 429, 429, 429]
    statuses = [(await send_raw(urls[i % 3], *post(target, same_id, CONTENT))).status for i in range(36)]
    assert statuses.count(200) == 30 - 2 and statuses.count(429) == 8  # the two streams counted too


async def test_an_upstream_task_id_no_path_could_hold_is_handed_out_as_an_alias(start_gateway):
    operation = "models/videogen-3.0/operations/op 1"

    def google_style(received: Received) -> bytes:
        if received.method == "POST":
            return json_answer(200, {"name": operation, "done": False})
        return json_answer(
            200, {"name": operation, "done": True, "status": "completed", "url": "https://cdn.example/v.mp4"}
        )

    server, received = recording_upstream(google_style)
    async with server:
        gw = await start_gateway(config(server.url))
        made = await send_raw(gw.url, *post("/v1/video/generations", bearer(ALICE), VIDEO))
        alias = made.json()["task_id"]
        assert alias != operation and PARAM_GRAMMAR["task_id"][0].fullmatch(alias)
        assert made.json()["id"] == alias
        polled = await get(gw.url, f"/v1/video/generations/{alias}", ALICE_TOO)
        assert polled.status == 200
        assert polled.json()["data"]["task_id"] == alias
        assert polled.json()["data"]["url"] == f"{gw.url}/v1/videos/{alias}/content"
        # The upstream's own id, from the gateway's record, as one segment.
        assert received[-1].target == "/v1/video/generations/models%2Fvideogen-3.0%2Foperations%2Fop%201"
        assert (await get(gw.url, f"/v1/video/generations/{alias}", BOB)).status == 404


async def test_two_channels_naming_the_same_task_never_share_it(start_gateway):
    one, one_seen = recording_upstream()
    two, two_seen = recording_upstream()
    async with one, two:
        gw = await start_gateway(
            config("unused").replace(
                f'channels: [{{name: up, base_url: "unused", credential: {SECRET}}}]',
                f'channels: [{{name: one, base_url: "{one.url}", models: ["videogen-3.0*"]}},'
                f' {{name: two, base_url: "{two.url}", models: ["videogen-3.1*"]}}]',
            )
        )
        mine = await send_raw(gw.url, *post("/v1/video/generations", bearer(ALICE), VIDEO))
        theirs = await send_raw(
            gw.url,
            *post("/v1/video/generations", bearer(BOB), b'{"model":"videogen-3.1-generate-preview","prompt":"x"}'),
        )
        assert mine.json()["task_id"] == "task_1"  # both upstreams said task_1
        alias = theirs.json()["task_id"]
        assert alias != "task_1"
        assert (await get(gw.url, "/v1/video/generations/task_1", BOB)).status == 404
        assert (await get(gw.url, "/v1/video/generations/task_1", ALICE)).status == 200
        assert (await get(gw.url, f"/v1/video/generations/{alias}", BOB)).status == 200
    assert one_seen[-1].target == two_seen[-1].target == "/v1/video/generations/task_1"
