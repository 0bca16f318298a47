"""The plugin pipeline: hooks in config order, short-circuits in the endpoint's shape, usage from every format."""

from __future__ import annotations

import pytest

from tests.recording_plugin import Choosy, Deferring, Recorder
from tests.sse import read_events

PIPELINE = """
routes:  # no auth: the pipeline alone is under test (public says that is meant)
  messages: {public: true, plugins: [usage, sse, tests.recording_plugin:Choosy, tests.recording_plugin:Recorder]}
  responses: {public: true, plugins: [usage, sse, tests.recording_plugin:Deferring, tests.recording_plugin:Recorder]}
  generate_content: {public: true, plugins: [usage, sse, tests.recording_plugin:Recorder]}
  stream_generate_content: {public: true, plugins: [usage, sse, tests.recording_plugin:Recorder]}
  image_generations: {public: true, plugins: [usage, sse, tests.recording_plugin.Recorder]}
plugins:
  tests.recording_plugin:Recorder: {drop_event: content_block_stop}
"""

CASES = {
    "messages": (
        "/v1/messages",
        {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"},
        {"model": "msgmodel-sonnet-4-5", "max_tokens": 50, "messages": [{"role": "user", "content": "a b c"}]},
    ),
    "responses": (
        "/v1/responses",
        {"Authorization": "Bearer sk-demo-key"},
        {"model": "respmodel-4o", "input": "a b c"},
    ),
    "content": (
        "/v1beta/models/genmodel-2.0-flash:{verb}?alt=sse&key=sk-demo-key",
        {},
        {"contents": [{"parts": [{"text": "a b c"}]}]},
    ),
    "images": (
        "/v1/images/generations",
        {"Authorization": "Bearer sk-demo-key"},
        {"model": "imagegen-2", "prompt": "a b c", "size": "1024x1024", "partial_images": 1},
    ),
}
EXPECTED_USAGE = {"messages": (3, 4), "responses": (3, 4), "content": (3, 4), "images": (50, 1056)}


@pytest.fixture
async def gw(start_gateway):
    Recorder.finished.clear()
    return await start_gateway(PIPELINE)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", list(CASES))
async def test_usage_is_read_from_json_answers_and_from_streams(gw, http, case, stream):
    path, headers, body = CASES[case]
    path = path.format(verb="streamGenerateContent" if stream else "generateContent")
    body = {**body, "stream": True} if stream and case != "content" else body
    async with http.post(gw.url + path, json=body, headers={**headers, "x-sim-output-tokens": "4"}) as answer:
        assert answer.status == 200
        await answer.read()
    usage = Recorder.finished[-1].usage
    assert (usage.input_tokens, usage.output_tokens) == EXPECTED_USAGE[case]


async def test_on_request_short_circuits_in_the_endpoints_shape(gw, http):
    path, headers, body = CASES["messages"]
    async with http.post(gw.url + path, json=body, headers={**headers, "x-test-refuse": "1"}) as answer:
        assert answer.status == 429
        assert await answer.json() == {
            "error": {"type": "rate_limit_error", "message": "refused by the test plugin", "code": "rate_limited"}
        }
        assert answer.headers["X-Request-Id"]
    assert len(gw.sim().requests) == 0


async def test_on_request_may_add_upstream_headers(gw, http):
    path, headers, body = CASES["responses"]
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 200
    assert gw.last_upstream_request().header("X-Added-By-Plugin") == "recorder"


async def test_on_response_may_rewrite_the_answer(gw, http):
    path, headers, body = CASES["responses"]
    async with http.post(gw.url + path, json=body, headers={**headers, "Accept-Encoding": "gzip"}) as answer:
        assert (await answer.json())["tagged_by"] == "recorder"


async def test_a_hook_that_hands_back_an_awaitable_is_awaited(gw, http):
    """A hook may be a plain function (Choosy's, auth's: no coroutine is made for it); one that
    returns an awaitable, as a decorated async method does, has it awaited, answer and all."""
    path, headers, body = CASES["responses"]
    completed = len(Deferring.completed)
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert (await answer.json())["deferred"] is True
    async with http.post(gw.url + path, json=body, headers={**headers, "x-test-defer": "1"}) as answer:
        assert answer.status == 403
        assert (await answer.json())["error"]["code"] == "deferred"
    assert len(Deferring.completed) == completed + 2  # a plain on_complete runs (nothing to await), each time


async def test_an_on_request_that_answers_with_no_response_fails_closed(gw, http):
    """A check that meant to refuse, but returned something else, never lets the request through."""
    path, headers, body = CASES["responses"]
    sent = len(gw.sim().requests)
    async with http.post(gw.url + path, json=body, headers={**headers, "x-test-junk": "1"}) as answer:
        assert answer.status == 500 and "error" in await answer.json()
    assert len(gw.sim().requests) == sent


async def test_on_event_may_drop_events(gw, http):
    path, headers, body = CASES["messages"]
    async with http.post(gw.url + path, json={**body, "stream": True}, headers=headers) as answer:
        _, events = await read_events(answer, on_event=lambda: 0)
    names = [e.name for e in events]
    assert "content_block_stop" not in names and names[-1] == "message_stop"


async def test_on_complete_sees_every_exchange_even_refused_ones(gw, http):
    path, headers, body = CASES["messages"]
    async with http.post(gw.url + path, json=body, headers={**headers, "x-test-refuse": "1"}):
        pass
    assert Recorder.finished[-1].outcome.status == 429 and Recorder.finished[-1].channel is None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_plugin_that_does_not_take_an_exchange_runs_none_of_its_hooks_for_it(gw, http, stream):
    """Plugin.takes, asked once before its on_request: no on_upstream, on_response, on_event nor
    on_complete follows a no, and the plugins after it run as ever (its prefetch, run before the
    caller is known, has run)."""
    Choosy.calls.clear()
    path, headers, body = CASES["messages"]
    body = {**body, "stream": True} if stream else body
    for test_id, take in (("taken", "1"), ("passed-over", "")):
        wanted = {**headers, "x-test-id": test_id, **({"x-test-take": take} if take else {})}
        async with http.post(gw.url + path, json=body, headers=wanted) as answer:
            assert answer.status == 200, await answer.text()
            await answer.read()
        assert Recorder.finished[-1].request.headers["x-test-id"] == test_id  # the plugin after it ran
    hooks = ["prefetch", "on_request", "on_upstream", "on_event" if stream else "on_response", "on_complete"]
    assert Choosy.calls == [("taken", hook) for hook in hooks] + [("passed-over", "prefetch")]


async def test_on_complete_hooks_run_together_and_one_failing_hides_none_of_the_others() -> None:
    """Together, so their first state calls go in one turn (one round trip); each on its own, so one
    plugin's failure neither stops nor hides another's bookkeeping."""
    import asyncio
    from types import SimpleNamespace

    from proxy.core.pipeline import Pipeline
    from proxy.core.plugin import Plugin

    started: list[str] = []
    finish = asyncio.Event()

    class Failing(Plugin):
        name = "failing"

        async def on_complete(self, ex) -> None:
            started.append(self.name)
            await finish.wait()
            raise RuntimeError("this plugin's bookkeeping failed")

    class Keeping(Plugin):
        name = "keeping"

        async def on_complete(self, ex) -> None:
            started.append(self.name)
            await finish.wait()
            ex.kept = True

    ex = SimpleNamespace(span=None, request_id="r1", kept=False)
    running = asyncio.get_running_loop().create_task(Pipeline([Failing(), Keeping()]).run_complete(ex))
    await asyncio.sleep(0.01)
    assert started == ["failing", "keeping"]  # both began before either ended
    finish.set()
    await running
    assert ex.kept
