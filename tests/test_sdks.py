"""The official client SDKs work against the gateway with only a base URL, a key and the spec's headers."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest
from google.genai import types as genai_types

KEY = "sk-demo-key"
# The spec's places for the key (section 5): this SDK release sends Authorization by default,
# so the message format's x-api-key is named explicitly, as the spec asks.
MSGAPI = {"msgapi-version": "2023-06-01", "x-api-key": KEY}


@pytest.fixture
async def gw(start_gateway):  # noqa: ANN001, ANN201
    return await start_gateway("""
        channels:
          - {name: sim, base_url: simulator, credential: upstream, simulator: {chunk_delay_ms: 0, output_tokens: 6}}
    """)


async def test_message_format_sdk_create_and_stream(gw):  # noqa: ANN001
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-demo-key", default_headers=MSGAPI)
    message = await client.messages.create(model="msgmodel-sonnet-4-5", max_tokens=64,
                                           messages=[{"role": "user", "content": "Hello"}])
    assert message.type == "message" and message.content[0].type == "text"
    assert message.usage.output_tokens == 6 and message.stop_reason == "end_turn"

    async with client.messages.stream(model="msgmodel-sonnet-4-5", max_tokens=64,
                                      messages=[{"role": "user", "content": "Hello"}]) as stream:
        text = "".join([chunk async for chunk in stream.text_stream])
        final = await stream.get_final_message()
    assert text == final.content[0].text and len(text.split()) == 6
    assert final.usage.output_tokens == 6
    assert gw.last_upstream_request("sim").header("x-api-key") == "upstream"


async def test_message_format_sdk_tool_use(gw):  # noqa: ANN001
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-demo-key", default_headers=MSGAPI)
    tool = {"name": "get_weather", "description": "weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    message = await client.messages.create(model="msgmodel-opus-4-5", max_tokens=64, tools=[tool],
                                           messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert message.stop_reason == "tool_use"
    use = next(b for b in message.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "simulated"}


async def test_response_format_sdk_create_and_stream(gw):  # noqa: ANN001
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-demo-key")
    first = await client.responses.create(model="respmodel-4o", input="Hello")
    assert first.status == "completed" and first.output_text.startswith("Turn 1:")
    second = await client.responses.create(model="respmodel-4o", input="Again", previous_response_id=first.id)
    assert second.output_text.startswith("Turn 2:") and second.usage.output_tokens == 6

    stream = await client.responses.create(model="respmodel-4o", input="Hi", stream=True,
                                           previous_response_id=second.id)
    kinds = []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert completed.output_text.startswith("Turn 3:")


async def test_images_sdk_generate(gw):  # noqa: ANN001
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-demo-key")
    result = await client.images.generate(model="imagegen-2", prompt="a lighthouse", size="1024x1024", n=2)
    assert len(result.data) == 2
    png = base64.b64decode(result.data[0].b64_json)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and int.from_bytes(png[16:20], "big") == 1024
    assert result.usage.output_tokens == 2112


@pytest.mark.parametrize("model", ["genmodel-2.0-flash", "genmodel-2.5-flash-image"])
async def test_content_generation_answers_validate_as_sdk_types(gw, http, model):  # noqa: ANN001
    url = f"{gw.url}/v1beta/models/{model}:generateContent?key=sk-demo-key"
    async with http.post(url, json={"contents": [{"role": "user", "parts": [{"text": "Hello"}]}]}) as answer:
        assert answer.status == 200
        parsed = genai_types.GenerateContentResponse.model_validate(await answer.json())
    assert parsed.candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert parsed.usage_metadata.total_token_count > 0 and parsed.response_id
    if "image" in model:
        assert parsed.candidates[0].content.parts[1].inline_data.mime_type == "image/png"
    else:
        assert parsed.text.split() == ["the", "quick", "brown", "fox", "jumps", "over"]


async def test_content_generation_stream_chunks_validate_as_sdk_types(gw, http):  # noqa: ANN001
    import json

    url = f"{gw.url}/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key=sk-demo-key"
    async with http.post(url, json={"contents": [{"parts": [{"text": "Hi"}]}]}) as answer:
        blocks = [b for b in (await answer.text()).split("\r\n\r\n") if b.strip()]
    chunks = [genai_types.GenerateContentResponse.model_validate(json.loads(b.removeprefix("data: "))) for b in blocks]
    assert "".join(c.text for c in chunks).split() == ["the", "quick", "brown", "fox", "jumps", "over"]
    assert chunks[-1].usage_metadata.candidates_token_count == 6


async def test_content_generation_sdk_client_against_the_gateway(gw):  # noqa: ANN001
    from google import genai

    import httpx2

    # The content-generation key travels as ?key= (spec section 5); the SDK's header is not read.
    async def add_key(request: httpx2.Request) -> None:
        request.url = request.url.copy_add_param("key", KEY)

    keyed = httpx2.AsyncClient(event_hooks={"request": [add_key]})
    client = genai.Client(api_key="unused-header-key", http_options=genai_types.HttpOptions(
        base_url=gw.url, api_version="v1beta", httpx_async_client=keyed))
    answer = await client.aio.models.generate_content(model="genmodel-2.0-flash", contents="Hello")
    assert answer.text.split()[:2] == ["the", "quick"]
    chunks = [c async for c in await client.aio.models.generate_content_stream(model="genmodel-2.0-flash",
                                                                                 contents="Hello")]
    assert "".join(c.text for c in chunks).split()[:2] == ["the", "quick"]
