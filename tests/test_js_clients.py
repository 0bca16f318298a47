"""The JavaScript SDKs (openai, @anthropic-ai/sdk, @google/genai) and the Vercel AI SDK (ai with
@ai-sdk/openai, @ai-sdk/anthropic, @ai-sdk/google), newest releases, configured with nothing but a
base URL and a key: generate, stream and a tool loop in each format, end to end through the
gateway to its simulator (and the AI SDK's chat provider translated to a message-format channel),
and what each does with the gateway's 504 (`x-should-retry: false`).

One node process makes every call (tests/js/clients.mjs, one JSON line per case); each test here
asserts on its case's line and on what the upstream received for that case."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from simulator.core import RecordedRequest
from tests.conftest import DEMO_KEY, RunningGateway, gateway_starter
from tests.js_install import SOURCE, installed

# A channel whose simulator answers after the channel's first-byte timeout: every call is the
# gateway's own 504. Its breaker never opens, so each case meets that 504, not a 503; its access
# log is off (its last line would come after the test's output is captured).
SLOW = """
    channels:
      - name: slow
        base_url: simulator
        timeouts: {first_byte_s: 0.2}
        simulator: {latency_ms: 1000}
    resilience: {breaker_failures: 1000}
    observability: {logging: {access_log: false}}
"""
# A gateway whose only channel speaks the message format: the AI SDK's chat calls are translated.
TRANSLATED = """
    channels:
      - {name: msg, base_url: simulator, credential: sim-upstream-key, formats: [messages]}
    observability: {logging: {access_log: false}}
"""
# One worker runs the whole file under pytest-xdist (.ci/run distributes by these groups): one
# node process, not one per worker.
pytestmark = pytest.mark.xdist_group("js_clients")
WORDS = "the quick brown fox jumps over a lazy dog".split()


@dataclass(slots=True)
class Run:
    results: dict[str, dict[str, Any]]
    base: RunningGateway
    slow: RunningGateway
    translated: RunningGateway
    stderr: str

    def result(self, case: str) -> dict[str, Any]:
        assert case in self.results, f"no line for {case!r}; node said:\n{self.stderr[-3000:]}"
        return self.results[case]

    def value(self, case: str) -> dict[str, Any]:
        line = self.result(case)
        assert line["ok"], line
        return line["value"]

    def error(self, case: str) -> dict[str, Any]:
        line = self.result(case)
        assert not line["ok"], line
        return line["error"]

    def upstream(self, case: str) -> list[RecordedRequest]:
        """The requests of one case, as the upstream received them: its prompt names the case."""
        marker = f"[{case}]".encode()
        sims = [self.base.sim(), self.slow.sim("slow"), self.translated.sim("msg")]
        return [r for sim in sims for r in sim.requests if r.body is not None and marker in r.body]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    folder = installed()  # once per machine (.ci/run does it first); again only when the lock file changes
    script = folder / "clients.mjs"  # beside node_modules/, where node resolves the clients' imports
    shutil.copyfile(SOURCE / "clients.mjs", script)
    async with gateway_starter(tmp_path_factory.mktemp("js-clients")) as start:
        base, slow, translated = await start(), await start(SLOW), await start(TRANSLATED)
        node = await asyncio.create_subprocess_exec(
            "node",
            str(script),
            json.dumps({"base": base.url, "slow": slow.url, "translated": translated.url, "key": DEMO_KEY}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(node.communicate(), 120)
        lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
        yield Run({line["case"]: line for line in lines}, base, slow, translated, err.decode())


def test_the_newest_majors_are_installed(run: Run) -> None:
    versions = run.value("versions")
    majors = {name: int(version.split(".")[0]) for name, version in versions.items()}
    assert majors == {
        "openai": 7,
        "@anthropic-ai/sdk": 1,
        "@google/genai": 3,
        "ai": 7,
        "@ai-sdk/openai": 4,
        "@ai-sdk/anthropic": 4,
        "@ai-sdk/google": 4,
        "zod": 4,
    }, versions


# -- each SDK in its own format: the simulator's words, whole and streamed, where each SDK sends them --

UPSTREAM_PATHS = {
    "openai generate": "/v1/responses",
    "openai stream": "/v1/responses",
    "openai chat generate": "/v1/chat/completions",
    "openai chat stream": "/v1/chat/completions",
    "anthropic generate": "/v1/messages",
    "anthropic stream": "/v1/messages",
    "genai generate": "/v1/models/genmodel-2.0-flash:generateContent",  # its default API version is v1
    "genai stream": "/v1/models/genmodel-2.0-flash:streamGenerateContent",
    "ai openai generateText": "/v1/responses",
    "ai openai streamText": "/v1/responses",
    "ai chat generateText": "/v1/chat/completions",
    "ai chat streamText": "/v1/chat/completions",
    "ai anthropic generateText": "/v1/messages",
    "ai anthropic streamText": "/v1/messages",
    "ai google generateText": "/v1beta/models/genmodel-2.0-flash:generateContent",
    "ai google streamText": "/v1beta/models/genmodel-2.0-flash:streamGenerateContent",
    "ai chat translated generateText": "/v1/messages",
    "ai chat translated streamText": "/v1/messages",
}


@pytest.mark.parametrize("case", list(UPSTREAM_PATHS))
def test_each_call_reaches_the_upstream_once_with_the_channels_key(run: Run, case: str) -> None:
    [upstream] = run.upstream(case)
    assert upstream.path == UPSTREAM_PATHS[case]
    sent = repr(upstream.headers) + upstream.query
    assert "sim-upstream-key" in sent and DEMO_KEY not in sent  # the embedded channel's credential, never the client's


@pytest.mark.parametrize("sdk", ["openai", "anthropic", "genai"])
def test_each_sdk_generates_and_streams_in_its_format(run: Run, sdk: str) -> None:
    whole, streamed = run.value(f"{sdk} generate"), run.value(f"{sdk} stream")
    for answer in (whole, streamed):
        assert " ".join(WORDS) in answer["text"], answer
    assert "".join(streamed["deltas"]) == streamed["text"] and len(streamed["deltas"]) >= 24
    if sdk == "openai":
        assert whole["status"] == "completed" and whole["usage"]["output_tokens"] == 24
        assert streamed["kinds"][0] == "response.created" and streamed["kinds"][-1] == "response.completed"
    elif sdk == "anthropic":
        assert whole["stop_reason"] == streamed["stop_reason"] == "end_turn"
        assert whole["usage"]["output_tokens"] == streamed["usage"]["output_tokens"] == 24
    else:
        assert whole["finish_reason"] == "STOP"
        assert whole["usage"]["candidatesTokenCount"] == streamed["usage"]["candidatesTokenCount"] == 24


def test_the_openai_sdk_chats_whole_and_streamed_and_a_stream_that_asks_no_usage_gets_none(run: Run) -> None:
    whole, streamed = run.value("openai chat generate"), run.value("openai chat stream")
    for answer in (whole, streamed):
        assert " ".join(WORDS) in answer["text"] and answer["finish_reason"] == "stop", answer
    assert whole["usage"]["completion_tokens"] == 24 and streamed["usages"] == []
    assert "".join(streamed["deltas"]) == streamed["text"] and len(streamed["deltas"]) >= 24
    [upstream] = run.upstream("openai chat stream")
    assert b'"include_usage":true' in upstream.body  # asked by the gateway, for its own count


@pytest.mark.parametrize("provider", ["openai", "chat", "anthropic", "google", "chat translated"])
def test_the_ai_sdk_generates_and_streams_text_in_each_format(run: Run, provider: str) -> None:
    whole, streamed = run.value(f"ai {provider} generateText"), run.value(f"ai {provider} streamText")
    for answer in (whole, streamed):
        assert " ".join(WORDS) in answer["text"] and answer["finishReason"] == "stop", answer
        assert answer["usage"]["outputTokens"] == 24
    assert "".join(streamed["deltas"]) == streamed["text"]


# -- the AI SDK's tool loop: a call, its result sent back, then the final text --


@pytest.mark.parametrize("provider", ["openai", "chat", "anthropic", "google", "chat translated"])
def test_the_ai_sdk_tool_loop_ends_with_text_after_the_tools_result(run: Run, provider: str) -> None:
    result = run.value(f"ai {provider} tool loop")
    called, answered = result["steps"][0], result["steps"][-1]
    assert len(result["steps"]) == 2, result
    [call] = called["toolCalls"]
    # Arguments made from the tool's schema (zod's, as JSON Schema in each format's own field).
    assert call["toolName"] == "weather" and isinstance(call["input"].get("city"), str) and call["input"]["city"]
    assert called["toolResults"] == [{"city": call["input"]["city"], "celsius": 21}]
    assert answered["toolCalls"] == [] and result["finishReason"] == "stop"
    assert result["text"] == answered["text"] and '"celsius":21' in answered["text"]  # the simulator quotes the result
    first, second = run.upstream(f"ai {provider} tool loop")
    assert b'"weather"' in first.body and b"celsius" in second.body  # the tool went up, then its result


# -- the gateway's 504 carries `x-should-retry: false`: who obeys it --


@pytest.mark.parametrize(
    ("case", "reached"),
    [
        ("openai 504", 1),  # it obeys x-should-retry (else it would retry a 504 twice)
        ("anthropic 504", 1),  # the same
        ("genai 504", 1),  # it retries nothing unless asked to
        ("genai 504 with retryOptions", 2),  # asked to, it retries by status alone
        ("ai openai 504 maxRetries 0", 1),  # the AI SDK retries by status alone: maxRetries: 0 sends once
        ("ai chat 504 maxRetries 0", 1),
        ("ai anthropic 504 maxRetries 0", 1),
        ("ai google 504 maxRetries 0", 1),
    ],
)
def test_a_gateway_504_reaches_the_upstream(run: Run, case: str, reached: int) -> None:
    error = run.error(case)
    assert error["status"] == 504, error
    assert len(run.upstream(case)) == reached


def test_the_ai_sdk_retries_a_504_twice_by_default_despite_x_should_retry(run: Run) -> None:
    error = run.error("ai openai 504 default retries")
    assert error["name"] == "RetryError" and error["attempts"] == 3 and error["status"] == 504, error
    assert len(run.upstream("ai openai 504 default retries")) == 3
