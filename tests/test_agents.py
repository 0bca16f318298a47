"""pydantic-ai agents against the gateway on its embedded defaults (the simulator behind it), each
model configured with nothing but a base URL and a key: an agent with one tool calls it with
arguments its signature accepts and ends with text made from the tool's result, in every chat
format; typed agents get their pydantic model back."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.google import GoogleModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.google import GoogleProvider
from pydantic_ai.providers.openai import OpenAIProvider

from tests.conftest import DEMO_KEY
from tests.test_tool_loops import CONTENT_MODEL, MESSAGE_MODEL, QUESTION, RESPONSE_MODEL, WEATHER, Forecast

# -- pydantic-ai, with nothing but a base URL and a key --


def _models(url: str) -> dict[str, Any]:
    return {
        "responses": OpenAIResponsesModel(
            RESPONSE_MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key=DEMO_KEY)
        ),
        "chat": OpenAIChatModel(RESPONSE_MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key=DEMO_KEY)),
        "messages": AnthropicModel(MESSAGE_MODEL, provider=AnthropicProvider(base_url=url, api_key=DEMO_KEY)),
        "content": GoogleModel(CONTENT_MODEL, provider=GoogleProvider(base_url=url, api_key=DEMO_KEY)),
    }


def _weather_agent(model: Any, calls: list[tuple[str, str, int]], **kwargs: Any) -> Agent[Any, Any]:
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"], days: int = 1) -> str:
        """The weather in a city, for the next few days."""
        calls.append((city, unit, days))
        return f"{WEATHER} in {city}"

    return Agent(model, tools=[get_weather], **kwargs)


def _assert_one_valid_call(calls: list[tuple[str, str, int]], messages: list[Any]) -> None:
    """The tool ran once, with the first arguments the model gave: pydantic-ai validates them
    against the function's signature and asks the model again (a retry prompt) when they fail."""
    assert len(calls) == 1
    city, unit, days = calls[0]
    assert isinstance(city, str) and unit in ("celsius", "fahrenheit") and isinstance(days, int)
    assert not [p for m in messages for p in m.parts if p.part_kind == "retry-prompt"]


@pytest.mark.parametrize("fmt", ["responses", "chat", "messages", "content"])
async def test_pydantic_ai_agent_with_a_tool_completes(gateway, fmt: str) -> None:
    calls: list[tuple[str, str, int]] = []
    result = await _weather_agent(_models(gateway.url)[fmt], calls).run(QUESTION)
    _assert_one_valid_call(calls, result.all_messages())
    assert f"{WEATHER} in {calls[0][0]}" in result.output  # the tool's own words
    assert len([m for m in result.all_messages() if m.kind == "response"]) == 2  # the call, then the answer


@pytest.mark.parametrize("fmt", ["responses", "chat", "messages", "content"])
async def test_pydantic_ai_agent_streams_to_the_end(gateway, fmt: str) -> None:
    calls: list[tuple[str, str, int]] = []
    async with _weather_agent(_models(gateway.url)[fmt], calls).run_stream(QUESTION) as run:
        output = await run.get_output()
    _assert_one_valid_call(calls, run.all_messages())
    assert f"{WEATHER} in {calls[0][0]}" in output


@pytest.mark.parametrize("fmt", ["responses", "chat", "messages", "content"])
async def test_pydantic_ai_typed_agent_with_a_tool(gateway, fmt: str) -> None:
    """The default output mode: a tool the framework adds and requires once the tools have run."""
    calls: list[tuple[str, str, int]] = []
    result = await _weather_agent(_models(gateway.url)[fmt], calls, output_type=Forecast).run(QUESTION)
    _assert_one_valid_call(calls, result.all_messages())
    assert isinstance(result.output, Forecast)


@pytest.mark.parametrize("fmt", ["responses", "chat", "content"])
async def test_pydantic_ai_native_structured_output(gateway, fmt: str) -> None:
    """`NativeOutput`: the format's own JSON answer (text.format json_schema, response_format
    json_schema, responseJsonSchema)."""
    result = await Agent(_models(gateway.url)[fmt], output_type=NativeOutput(Forecast)).run("Forecast for Paris")
    assert isinstance(result.output, Forecast)
    sent = json.loads(gateway.last_upstream_request().body)
    if fmt == "responses":
        assert sent["text"]["format"]["type"] == "json_schema"
    elif fmt == "chat":
        assert sent["response_format"]["type"] == "json_schema"
    else:
        assert sent["generationConfig"]["responseMimeType"] == "application/json"
