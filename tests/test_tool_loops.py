"""A conversation with tools against the gateway on its embedded defaults (the simulator behind
it), with the official SDKs: a tool is called with arguments that validate against its schema (in
any of the schema dialects the formats carry), the loop ends once the tool's result is back, and
structured answers validate against the caller's schema, in every chat format, streamed and not."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import aiohttp
import anthropic
import jsonschema
import openai
import pytest
from aiohttp import web
from google import genai
from google.genai import types as genai_types
from pydantic import BaseModel, Field

from proxy.config.model import SimulatorSettings
from proxy.formats import MESSAGES, RESPONSES
from simulator import build_simulator_app, turns
from simulator.core import Simulator
from tests.conftest import DEMO_KEY, MESSAGE_HEADERS

RESPONSE_MODEL, MESSAGE_MODEL, CONTENT_MODEL = "respmodel-4o", "msgmodel-sonnet-4-5", "genmodel-2.0-flash"
WEATHER = "18 degrees and sunny"  # what every tool here answers: recognisable in the final text
QUESTION = "What is the weather in Paris?"
# Arguments with an enum, bounds and a nested object with a $ref: what a generated call must satisfy.
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit", "days", "place"],
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 3, "maximum": 7},
        "place": {"$ref": "#/$defs/Place"},
    },
    "$defs": {
        "Place": {
            "type": "object",
            "required": ["lat", "lon"],
            "additionalProperties": False,
            "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"anyOf": [{"type": "number", "exclusiveMinimum": 100}, {"type": "null"}]},
            },
        }
    },
}
# The same arguments as content generation's OpenAPI subset spells them (no $ref, no anyOf).
WEATHER_OPENAPI: dict[str, Any] = {
    "type": "OBJECT",
    "required": ["city", "unit", "days"],
    "properties": {
        "city": {"type": "STRING"},
        "unit": {"type": "STRING", "format": "enum", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "INTEGER", "minimum": 3, "maximum": "7"},
        "tags": {"type": "ARRAY", "minItems": "2", "items": {"type": "STRING"}},
    },
}
WEATHER_OPENAPI_AS_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["city", "unit", "days"],
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 3, "maximum": 7},
        "tags": {"type": "array", "minItems": 2, "items": {"type": "string"}},
    },
}


class Conditions(BaseModel):
    sky: Literal["clear", "cloudy", "rain"]
    wind_kmh: float = Field(ge=0, le=200)


class Forecast(BaseModel):
    city: str = Field(min_length=1)
    temperatures: list[int] = Field(min_length=1, max_length=7)
    conditions: Conditions
    warning: str | None = None


# -- the official SDKs: the two steps of a tool loop, by hand --


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_response_sdk_tool_loop_ends_with_text_quoting_the_result(gateway, streamed: bool) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        }
    ]

    async def create(**kwargs: Any) -> Any:
        if not streamed:
            return await client.responses.create(model=RESPONSE_MODEL, tools=tools, **kwargs)
        async with client.responses.stream(model=RESPONSE_MODEL, tools=tools, **kwargs) as stream:
            return await stream.get_final_response()

    first = await create(input=QUESTION)
    call = next(item for item in first.output if item.type == "function_call")
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    history: Any = [
        {"role": "user", "content": QUESTION},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": WEATHER},
    ]
    second = await create(input=history)
    assert [item.type for item in second.output] == ["message"] and WEATHER in second.output_text
    # chained by previous_response_id instead, only the result is sent
    chained = await create(
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": WEATHER}],
        previous_response_id=first.id,
    )
    assert WEATHER in chained.output_text


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_message_sdk_tool_loop_ends_with_text_quoting_the_result(gateway, streamed: bool) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=DEMO_KEY)
    tools: Any = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]

    async def create(messages: Any) -> Any:
        if not streamed:
            return await client.messages.create(model=MESSAGE_MODEL, max_tokens=256, tools=tools, messages=messages)
        async with client.messages.stream(
            model=MESSAGE_MODEL, max_tokens=256, tools=tools, messages=messages
        ) as stream:
            return await stream.get_final_message()

    question = [{"role": "user", "content": QUESTION}]
    first = await create(question)
    use = next(block for block in first.content if block.type == "tool_use")
    assert first.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    second = await create(
        question
        + [
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": WEATHER}]}
                ],
            },
        ]
    )
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
    assert WEATHER in second.content[0].text


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("field", "schema", "as_json_schema"),
    [
        ("parameters_json_schema", WEATHER_SCHEMA, WEATHER_SCHEMA),
        ("parameters", WEATHER_OPENAPI, WEATHER_OPENAPI_AS_JSON_SCHEMA),
    ],
    ids=["parametersJsonSchema", "parameters"],
)
async def test_content_sdk_tool_loop_ends_with_text_quoting_the_result(
    gateway,
    streamed: bool,
    field: str,
    schema: dict[str, Any],
    as_json_schema: dict[str, Any],
) -> None:
    client = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gateway.url))
    declaration = {"name": "get_weather", "description": "Weather in a city", field: schema}
    config = genai_types.GenerateContentConfig(tools=[genai_types.Tool(function_declarations=[declaration])])

    async def generate(contents: Any) -> genai_types.GenerateContentResponse:
        if not streamed:
            return await client.aio.models.generate_content(model=CONTENT_MODEL, contents=contents, config=config)
        chunks = [
            chunk
            async for chunk in await client.aio.models.generate_content_stream(
                model=CONTENT_MODEL, contents=contents, config=config
            )
        ]
        parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
        return genai_types.GenerateContentResponse(
            candidates=[genai_types.Candidate(content=genai_types.Content(role="model", parts=parts))]
        )

    question = genai_types.Content(role="user", parts=[genai_types.Part(text=QUESTION)])
    first = await generate([question])
    assert first.function_calls and first.function_calls[0].name == "get_weather"
    jsonschema.validate(first.function_calls[0].args, as_json_schema)
    result = genai_types.Part.from_function_response(name="get_weather", response={"result": WEATHER})
    second = await generate([question, first.candidates[0].content, genai_types.Content(role="user", parts=[result])])
    assert not second.function_calls and WEATHER in second.text


# -- the official SDKs: structured answers --


async def test_response_sdk_parse_gives_the_pydantic_model(gateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    parsed = await client.responses.parse(model=RESPONSE_MODEL, input="Forecast for Paris", text_format=Forecast)
    assert isinstance(parsed.output_parsed, Forecast)
    async with client.responses.stream(
        model=RESPONSE_MODEL, input="Forecast for Paris", text_format=Forecast
    ) as stream:
        assert isinstance((await stream.get_final_response()).output_parsed, Forecast)
    schema = Forecast.model_json_schema()
    raw = await client.responses.create(
        model=RESPONSE_MODEL,
        input="Forecast",
        text={"format": {"type": "json_schema", "name": "forecast", "schema": schema}},
    )
    jsonschema.validate(json.loads(raw.output_text), schema)


async def test_message_sdk_parse_and_a_forced_tool(gateway) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=DEMO_KEY)
    parsed = await client.messages.parse(
        model=MESSAGE_MODEL,
        max_tokens=256,
        output_format=Forecast,
        messages=[{"role": "user", "content": "Forecast for Paris"}],
    )
    assert isinstance(parsed.parsed_output, Forecast)
    tools: Any = [
        {"name": "get_time", "input_schema": {"type": "object"}},
        {"name": "get_weather", "input_schema": WEATHER_SCHEMA},
    ]
    forced = await client.messages.create(
        model=MESSAGE_MODEL,
        max_tokens=256,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert [(b.type, b.name) for b in forced.content] == [("tool_use", "get_weather")]
    jsonschema.validate(forced.content[0].input, WEATHER_SCHEMA)


@pytest.mark.parametrize("spelling", ["response_schema", "response_json_schema"])
async def test_content_sdk_structured_answer_validates(gateway, spelling: str) -> None:
    client = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gateway.url))
    schema = Forecast if spelling == "response_schema" else Forecast.model_json_schema()
    config = genai_types.GenerateContentConfig(response_mime_type="application/json", **{spelling: schema})
    answer = await client.aio.models.generate_content(model=CONTENT_MODEL, contents="Forecast for Paris", config=config)
    assert Forecast.model_validate_json(answer.text)
    chunks = [
        c.text
        async for c in await client.aio.models.generate_content_stream(
            model=CONTENT_MODEL, contents="Forecast for Paris", config=config
        )
    ]
    jsonschema.validate(json.loads("".join(chunks)), Forecast.model_json_schema())
    enum = await client.aio.models.generate_content(
        model=CONTENT_MODEL,
        contents="Sky?",
        config={"response_mime_type": "text/x.enum", "response_schema": {"type": "STRING", "enum": ["clear", "rain"]}},
    )
    assert enum.text == "clear"


# Schemas of the kinds callers send, each answered (as text.format json_schema) with JSON it accepts.
SCHEMAS: dict[str, dict[str, Any]] = {
    "pydantic model with $defs": Forecast.model_json_schema(),
    "strict mode (every property required, nullables)": {
        "type": "object",
        "additionalProperties": False,
        "required": ["a", "b"],
        "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "array", "items": {"type": "boolean"}}},
    },
    "enum, const and bounds": {
        "type": "object",
        "required": ["e", "c", "i", "n", "s"],
        "properties": {
            "e": {"enum": [None, 3, "x"]},
            "c": {"const": {"k": [1]}},
            "i": {"type": "integer", "exclusiveMinimum": 10, "multipleOf": 4},
            "n": {"type": "number", "minimum": -5.5, "maximum": -5.25},
            "s": {"type": "string", "minLength": 12, "maxLength": 14},
        },
    },
    "formats and patterns": {
        "type": "object",
        "required": ["when", "mail", "id", "code"],
        "properties": {
            "when": {"type": "string", "format": "date-time"},
            "mail": {"type": "string", "format": "email"},
            "id": {"type": "string", "format": "uuid"},
            "code": {"type": "string", "pattern": "^[A-Z][0-9]$"},
        },
    },
    "allOf, oneOf and tuples": {
        "allOf": [
            {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}},
            {
                "required": ["y"],
                "properties": {"y": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]}},
            },
        ],
        "properties": {
            "t": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}
        },
    },
    "a recursive tree": {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "required": ["name", "children"],
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
            }
        },
    },
    "unique items": {"type": "array", "minItems": 3, "uniqueItems": True, "items": {"type": "string"}},
}


async def test_structured_answers_validate_against_every_kind_of_schema(gateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    for name, schema in SCHEMAS.items():
        answer = await client.responses.create(
            model=RESPONSE_MODEL,
            input="Answer",
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        )
        try:
            jsonschema.validate(json.loads(answer.output_text), schema)
        except jsonschema.ValidationError as error:
            raise AssertionError(f"{name}: {answer.output_text}") from error


# -- hostile schemas: the simulator shares the gateway's event loop on its embedded defaults --

ARGUMENTS_CAP = 65_536  # characters of JSON one made value may hold (simulator/schema_values.py)
A_LOOP_OF_ALL_OF = {
    "type": "object",
    "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}] * 5}},
    "properties": {"x": {"$ref": "#/$defs/A"}},
    "required": ["x"],
}
# Each was once minutes of one core, hundreds of megabytes, or an exception (aiohttp's plain-text 500).
HOSTILE: dict[str, dict[str, Any]] = {
    "allOf cycling through $ref, five wide": A_LOOP_OF_ALL_OF,
    "allOf cycling through $ref, fifty wide": {
        **A_LOOP_OF_ALL_OF,
        "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}] * 50}},
    },
    "ten thousand items of a 20 KB const": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "array", "minItems": 10_000, "items": {"const": "x" * 20_000}}},
    },
    "ten thousand items of a 100k-value enum": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "array", "minItems": 10_000, "items": {"enum": list(range(100_000))}}},
    },
    "ten thousand strings of 16k characters": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "array", "minItems": 10_000, "items": {"type": "string", "minLength": 16_384}}},
    },
    "infinite minItems": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "array", "minItems": "inf"}},
    },
    "infinite minimum": {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": "integer", "minimum": "inf"}, "b": {"type": "integer", "minimum": "1e400"}},
    },
    "a step finer than a double": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"multipleOf": 1e-320, "minimum": 1e300}},
    },
    "arrays of a thousand, thirty deep": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": json.loads('{"type": "array", "minItems": 1000, "items": ' * 30 + "{}" + "}" * 30)},
    },
    "a pattern that backtracks for ever": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "string", "format": "uuid", "pattern": "(.*)*Z"}},
    },
    "a thousand such patterns": {
        "type": "object",
        "required": [f"p{n}" for n in range(1000)],
        "properties": {f"p{n}": {"type": "string", "format": "uuid", "pattern": "(.*)*Z"} for n in range(1000)},
    },
    "objects four hundred deep": {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": json.loads('{"type": "object", "required": ["a"], "properties": {"a": ' * 400 + "{}" + "}}" * 400)
        },
    },
}


async def _bystander(session: Any, url: str) -> int:
    async with session.post(
        url + "/v1/messages",
        headers=MESSAGE_HEADERS,
        json={"model": MESSAGE_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ) as answer:
        await answer.read()
        return answer.status


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_tool_schema_gets_bounded_arguments_and_stalls_no_one(spawn, name: str) -> None:
    gateway = spawn("defaults")  # a process of its own: a frozen loop there cannot freeze this test's timeout
    timeout = aiohttp.ClientTimeout(total=10)  # far past what an answer takes: reaching it is the failure
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def hostile() -> tuple[int, Any]:
            async with session.post(
                gateway.url + "/v1/messages",
                headers=MESSAGE_HEADERS,
                json={
                    "model": MESSAGE_MODEL,
                    "max_tokens": 16,
                    "messages": [{"role": "user", "content": QUESTION}],
                    "tools": [{"name": "t", "input_schema": HOSTILE[name]}],
                },
            ) as answer:
                return answer.status, await answer.json()

        (status, body), bystander = await asyncio.gather(hostile(), _bystander(session, gateway.url))
    assert (status, bystander) == (200, 200), body
    call = next(block for block in body["content"] if block["type"] == "tool_use")
    assert isinstance(call["input"], dict)
    assert len(json.dumps(call["input"], separators=(",", ":"))) <= ARGUMENTS_CAP


async def test_a_tool_choice_of_any_shape_is_tolerated(gateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]
    for names in ([{"name": {"a": 1}}], [{"name": ["get_weather"]}, {"type": "function", "name": "get_weather"}]):
        answer = await client.responses.create(
            model=RESPONSE_MODEL,
            input=QUESTION,
            tools=tools,
            tool_choice={"type": "allowed_tools", "mode": "auto", "tools": names},
        )  # type: ignore[arg-type,typeddict-item]
        assert answer.status == "completed"


async def test_an_unforeseen_simulator_failure_is_a_500_in_the_formats_error_shape(monkeypatch, caplog) -> None:
    def broken(schema: Any) -> Any:
        raise RuntimeError("a bug in the simulator")

    monkeypatch.setattr(turns, "value_for", broken)
    runner = web.AppRunner(build_simulator_app(Simulator("upstream", SimulatorSettings())))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                url + "/v1/messages",
                json={
                    "model": MESSAGE_MODEL,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                },
            ) as answer:
                assert answer.status == 500
                assert answer.content_type == "application/json"
                assert await answer.json() == MESSAGES.error_payload(500, "simulated upstream: internal error")
            async with session.post(
                url + "/v1/responses",
                json={
                    "model": RESPONSE_MODEL,
                    "input": "hi",
                    "tools": [{"type": "function", "name": "t", "parameters": {"type": "object"}}],
                },
            ) as answer:
                assert answer.status == 500
                assert await answer.json() == RESPONSES.error_payload(500, "simulated upstream: internal error")
    finally:
        await runner.cleanup()
    failures = [r for r in caplog.records if r.name == "modelgate.simulator" and r.exc_info]
    assert [r.getMessage() for r in failures] == [
        "simulator failed answering POST /v1/messages",
        "simulator failed answering POST /v1/responses",
    ]
