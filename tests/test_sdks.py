"""The official SDKs, newest releases, configured with nothing but a base URL and a key: every call
README's table names, sync, async and streamed, end to end through the gateway to its channel."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from tests.conftest import DEMO_KEY

PNG = (Path(__file__).parent.parent / "examples" / "photo.png").read_bytes()
VIDEO_MODEL = "videogen-3.0-generate-001"


@pytest.fixture
async def gw(start_gateway):
    return await start_gateway("""
        channels:
          - name: sim
            base_url: simulator
            credential: upstream
            simulator: {chunk_delay_ms: 0, output_tokens: 6, video_queued_s: 0.1, video_processing_s: 0.2}
    """)


# -- the message SDK: Authorization: Bearer and anthropic-version, as it sends them --


async def test_message_sdk_create_stream_count_and_list(gw):
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=DEMO_KEY)
    message = await client.messages.create(
        model="msgmodel-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message.type == "message" and message.content[0].type == "text"
    assert message.usage.output_tokens == 6 and message.stop_reason == "end_turn"
    upstream = gw.last_upstream_request("sim")
    assert upstream.header("x-api-key") == "upstream" and DEMO_KEY not in repr(upstream.headers)

    async with client.messages.stream(
        model="msgmodel-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        text = "".join([chunk async for chunk in stream.text_stream])
        final = await stream.get_final_message()
    assert text == final.content[0].text and len(text.split()) == 6 and final.usage.output_tokens == 6

    counted = await client.messages.count_tokens(
        model="msgmodel-sonnet-4-5", messages=[{"role": "user", "content": "one two three"}]
    )
    assert counted.input_tokens == 3
    models = [m.id async for m in client.models.list()]
    assert "msgmodel-sonnet-4-5" in models and not [m for m in models if not m.startswith("msgmodel-")]
    assert (await client.models.retrieve("msgmodel-sonnet-4-5")).id == "msgmodel-sonnet-4-5"
    with pytest.raises(anthropic.AuthenticationError):  # its errors in its own shape, on the shared path too
        await anthropic.AsyncAnthropic(base_url=gw.url, api_key="wrong-key").models.list()


async def test_message_sdk_tool_use_and_thinking_types(gw):
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=DEMO_KEY)
    tool = {
        "name": "get_weather",
        "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    message = await client.messages.create(
        model="msgmodel-opus-4-5",
        max_tokens=64,
        tools=[tool],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    use = next(b for b in message.content if b.type == "tool_use")
    assert message.stop_reason == "tool_use" and use.input == {"city": "simulated"}
    adaptive = await client.messages.create(
        model="msgmodel-opus-4-5",
        max_tokens=2048,
        thinking={"type": "adaptive"},  # newer than the gateway's schema
        messages=[{"role": "user", "content": "Think"}],
    )
    assert adaptive.type == "message"


async def test_message_sdk_sync(gw):
    client = anthropic.Anthropic(base_url=gw.url, api_key=DEMO_KEY)
    message = await asyncio.to_thread(
        client.messages.create, model="msgmodel-haiku-4-5", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.content[0].text


# -- the response SDK: responses, images, videos, models --


async def test_response_sdk_create_stream_retrieve_items_cancel_delete(gw):
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY)
    first = await client.responses.create(model="respmodel-4o", input="Hello")
    assert first.status == "completed" and first.output_text.startswith("Turn 1:")
    second = await client.responses.create(model="respmodel-4o", input="Again", previous_response_id=first.id)
    assert second.output_text.startswith("Turn 2:") and second.usage.output_tokens == 6

    stream = await client.responses.create(
        model="respmodel-4o", input="Hi", stream=True, previous_response_id=second.id
    )
    kinds = []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert completed.output_text.startswith("Turn 3:")

    again = await client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    items = [item async for item in client.responses.input_items.list(first.id)]
    assert items[0].type == "message" and items[0].content[0].text == "Hello"
    background = await client.responses.create(model="respmodel-4o", input="Later", background=True)
    assert background.status == "queued"
    assert (await client.responses.cancel(background.id)).status == "cancelled"
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):  # an id the gateway never handed out: the format's own 404
        await client.responses.retrieve("resp_never_made")


async def test_images_sdk_generate_and_edit_with_response_format_20_times(gw):
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY)
    result = await client.images.generate(model="imagegen-2", prompt="a lighthouse", size="1024x1024", n=2)
    png = base64.b64decode(result.data[0].b64_json)
    assert len(result.data) == 2 and png.startswith(b"\x89PNG\r\n\x1a\n") and result.usage.output_tokens == 2112
    for _ in range(20):
        edited = await client.images.edit(
            model="imagegen-1", image=("photo.png", PNG, "image/png"), prompt="make it blue", response_format="b64_json"
        )
        assert base64.b64decode(edited.data[0].b64_json).startswith(b"\x89PNG")


async def test_video_sdk_create_retrieve_list_and_download(gw):
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY)
    early = await client.videos.create(model=VIDEO_MODEL, prompt="waves at dusk", seconds="8", size="1280x720")
    # Before any poll the channel is asked: the task still runs, a 409 (which the SDK would retry
    # after the Retry-After it carries; here it is asked not to).
    with pytest.raises(openai.ConflictError):
        await client.with_options(max_retries=0).videos.download_content(early.id)
    video = await client.videos.create(
        model=VIDEO_MODEL, prompt="waves at dusk", input_reference=("ref.png", PNG, "image/png")
    )
    assert video.object == "video" and video.status == "queued" and video.model == VIDEO_MODEL
    for _ in range(100):
        video = await client.videos.retrieve(video.id)
        if video.status == "completed":
            break
        assert video.status in ("queued", "in_progress")
        await asyncio.sleep(0.05)
    assert video.status == "completed" and video.progress == 100 and video.completed_at
    listed = [v.id async for v in client.videos.list()]
    assert listed[:2] == [video.id, early.id]
    content = await client.videos.download_content(video.id)
    assert (await content.aread())[4:8] == b"ftyp"


async def test_response_sdk_models_and_sync(gw):
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY)
    models = await asyncio.to_thread(lambda: [m.id for m in client.models.list()])
    assert {"respmodel-4o", "msgmodel-sonnet-4-5", "imagegen-2", VIDEO_MODEL} <= set(models)
    assert (await asyncio.to_thread(client.models.retrieve, "respmodel-4o")).id == "respmodel-4o"
    answer = await asyncio.to_thread(client.responses.create, model="respmodel-4o", input="Hello")
    assert answer.output_text.startswith("Turn 1:")


# -- the content-generation SDK: its default API version (v1) and its x-goog-api-key --


@pytest.mark.parametrize("version", [None, "v1beta"])
async def test_content_sdk_generate_stream_and_count(gw, version):
    options = genai_types.HttpOptions(base_url=gw.url, **({"api_version": version} if version else {}))
    client = genai.Client(api_key=DEMO_KEY, http_options=options)
    answer = await client.aio.models.generate_content(model="genmodel-2.0-flash", contents="Hello")
    assert answer.text.split()[:2] == ["the", "quick"] and answer.usage_metadata.total_token_count > 0
    upstream = gw.last_upstream_request("sim")
    assert upstream.path == f"/{version or 'v1'}/models/genmodel-2.0-flash:generateContent"
    assert DEMO_KEY not in repr(upstream.headers) + upstream.query and "key=upstream" in upstream.query
    chunks = [
        c async for c in await client.aio.models.generate_content_stream(model="genmodel-2.0-flash", contents="Hello")
    ]
    assert "".join(c.text for c in chunks).split() == ["the", "quick", "brown", "fox", "jumps", "over"]
    counted = await client.aio.models.count_tokens(model="genmodel-2.0-flash", contents="one two three")
    assert counted.total_tokens == 3
    listed = [m.name async for m in await client.aio.models.list()]
    assert "models/genmodel-2.0-flash" in listed
    assert (await client.aio.models.get(model="genmodel-2.0-flash")).name == "models/genmodel-2.0-flash"


async def test_content_sdk_sync_and_its_errors_in_its_shape(gw):
    client = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gw.url))
    answer = await asyncio.to_thread(client.models.generate_content, model="genmodel-2.0-flash", contents="Hi")
    assert answer.text
    bad = genai.Client(api_key="not-a-key", http_options=genai_types.HttpOptions(base_url=gw.url))
    with pytest.raises(genai.errors.ClientError) as refused:
        await bad.aio.models.generate_content(model="genmodel-2.0-flash", contents="Hi")
    assert refused.value.code == 401 and refused.value.status == "UNAUTHENTICATED"
    with pytest.raises(genai.errors.ClientError) as refused:  # `/v1/models` is shared: answered in its shape
        await bad.aio.models.list()
    assert refused.value.status == "UNAUTHENTICATED"


@pytest.mark.filterwarnings("ignore:The generate_images method is deprecated")
async def test_content_sdk_has_no_error_class_per_status_and_its_image_and_video_calls_need_vertex(gw):
    # What README says of it: no AuthenticationError or RateLimitError to catch, only ClientError and
    # ServerError with the status in `.code` (the test above catches a 401 so).
    assert not hasattr(genai.errors, "AuthenticationError") and not hasattr(genai.errors, "RateLimitError")
    client = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gw.url))
    before = len(gw.sim("sim").requests)
    with pytest.raises(ValueError, match="only supported in"):  # Vertex AI only, refused before sending
        await client.aio.models.generate_images(model="genmodel-2.5-flash-image", prompt="a lighthouse")
    with pytest.raises(ValueError, match="only supported in"):
        await client.aio.models.generate_videos(model=VIDEO_MODEL, prompt="waves at dusk")
    assert len(gw.sim("sim").requests) == before


@pytest.mark.parametrize("model", ["genmodel-2.0-flash", "genmodel-2.5-flash-image"])
async def test_content_generation_answers_validate_as_sdk_types(gw, http, model):
    url = f"{gw.url}/v1beta/models/{model}:generateContent?key={DEMO_KEY}"
    async with http.post(url, json={"contents": [{"role": "user", "parts": [{"text": "Hello"}]}]}) as answer:
        assert answer.status == 200
        parsed = genai_types.GenerateContentResponse.model_validate(await answer.json())
    assert parsed.candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert parsed.usage_metadata.total_token_count > 0 and parsed.response_id
    if "image" in model:
        assert parsed.candidates[0].content.parts[1].inline_data.mime_type == "image/png"
    else:
        assert parsed.text.split() == ["the", "quick", "brown", "fox", "jumps", "over"]


async def test_content_generation_stream_chunks_validate_as_sdk_types(gw, http):
    url = f"{gw.url}/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={DEMO_KEY}"
    async with http.post(url, json={"contents": [{"parts": [{"text": "Hi"}]}]}) as answer:
        blocks = [b for b in (await answer.text()).split("\r\n\r\n") if b.strip()]
    chunks = [genai_types.GenerateContentResponse.model_validate(json.loads(b.removeprefix("data: "))) for b in blocks]
    assert "".join(c.text for c in chunks).split() == ["the", "quick", "brown", "fox", "jumps", "over"]
    assert chunks[-1].usage_metadata.candidates_token_count == 6


# -- litellm as a client, in a Python of its own: it takes openai 3 (1.110 asks openai>=2.20,<4), but
# its many pinned dependencies stay out of the gateway's test environment --

LITELLM_VENV = Path(__file__).parent.parent / ".venv-litellm"
LITELLM = ("litellm>=1.106", "mcp>=1.0")  # its responses API imports mcp


async def test_image_urls_through_the_images_and_content_sdks(start_gateway, http, tmp_path):
    gw = await start_gateway(f"""
        keys: [{{name: art, key: {DEMO_KEY}, url_delivery: true}}]
        channels: [{{name: sim, base_url: simulator, accepts_response_format: false}}]
        plugins: {{url_delivery: {{enabled: true, dir: '{tmp_path}'}}}}
    """)
    images = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY)
    made = await images.images.generate(model="imagegen-2", prompt="a lighthouse", response_format="url")
    content = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gw.url))
    asked = genai_types.GenerateContentConfig(
        http_options=genai_types.HttpOptions(
            extra_body={"generationConfig": {"responseFormat": {"image": {"delivery": "URI"}}}}
        )
    )  # docs/url-delivery.md
    answer = await content.aio.models.generate_content(
        model="genmodel-2.5-flash-image", contents="a lighthouse", config=asked
    )
    uri = next(p.file_data.file_uri for p in answer.candidates[0].content.parts if p.file_data)
    for url in (made.data[0].url, uri):
        assert url.startswith(gw.url + "/images/")  # the gateway's own signed link, not the upstream's
        async with http.get(url) as fetched:
            assert fetched.status == 200 and (await fetched.read()).startswith(b"\x89PNG")


@pytest.fixture(scope="session")
def litellm_python() -> Path:
    """.venv-litellm's Python (made here when .ci/run has not made it: about 30 s, once)."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import litellm, mcp"]).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *LITELLM], check=True, timeout=600)
    return python


async def test_litellm_providers_reach_the_gateway_with_a_base_url_and_a_key(gw, litellm_python):
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no fetch of its price list from the network
    run = await asyncio.create_subprocess_exec(
        str(litellm_python),
        str(Path(__file__).parent / "litellm_calls.py"),
        gw.url,
        DEMO_KEY,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(run.communicate(), 120)
    results = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert [r["call"] for r in results] == [
        "anthropic/",
        "gemini/",
        "openai/ responses",
        "openai/",
        "anthropic/ stream",
        "gemini/ stream",
        "openai/ responses stream",
        "openai/ stream",
    ], err.decode()[-2000:]
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed
    for result in results:  # the simulator's words, through each provider's parsing
        assert result["text"].split()[:2] in (["the", "quick"], ["Turn", "1:"]), result
