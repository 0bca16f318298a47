"""Clients of tomorrow (issue 30, cases 1-7): what the newest SDKs send is not refused for a value
the interface's tables do not list yet, and what an unlisted value does is counted and logged.

Each case goes client -> gateway -> simulator through real sockets, with the SDK that sends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import aiohttp
import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types as genai_types
from prometheus_client.parser import text_string_to_metric_families

from plugins.validation import LOGGED_PER_REQUEST, FirstSeen
from proxy.schemas.enums import MOST_UNLISTED, OPEN_FIELDS
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS
from tests.test_validation import form, png

RESPONSE = {"model": "respmodel-4o", "input": "hi"}
MESSAGE = {"model": "msgmodel-sonnet-4-5", "max_tokens": 64}
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


def sent(gw) -> dict:
    """The JSON body the upstream received last."""
    return json.loads(gw.last_upstream_request().body)


async def post_raw_response(http, gw, raw: bytes) -> None:
    """A response-format request whose JSON bytes are the test's own (escapes, a name given twice), answered 200."""
    async with http.post(
        gw.url + "/v1/responses", data=raw, headers={**BEARER, "Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 200, await answer.text()


# -- cases 1 and 2: the response format --


@pytest.mark.parametrize("effort", ["minimal", "none", "xhigh"])
async def test_case_1_newer_reasoning_efforts_reach_the_upstream(gateway, effort):
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    answer = await client.responses.create(model="respmodel-5", input="Think", reasoning={"effort": effort})
    assert answer.status == "completed"
    assert sent(gateway)["reasoning"] == {"effort": effort}


async def test_case_2_the_priority_service_tier_reaches_the_upstream(gateway):
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    answer = await client.responses.create(model="respmodel-4o", input="Hi", service_tier="priority")
    assert answer.status == "completed" and answer.service_tier == "priority"  # the simulator says the tier it used
    assert sent(gateway)["service_tier"] == "priority"


async def test_a_tool_output_given_as_content_parts_reaches_the_upstream(gateway):
    """The interface names a string; the openai SDK's type also lets a tool return content parts."""
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    output = [
        {"type": "input_text", "text": "sunny, 21 C"},
        {"type": "input_image", "image_url": "data:image/png;base64," + PNG_B64},
    ]
    answer = await client.responses.create(
        model="respmodel-4o",
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": output},
        ],
    )
    assert answer.status == "completed"
    assert sent(gateway)["input"][2]["output"] == output
    with pytest.raises(openai.BadRequestError):  # a type rule still holds: not a number
        await client.responses.create(
            model="respmodel-4o", input=[{"type": "function_call_output", "call_id": "call_1", "output": 42}]
        )


# -- case 3: the message format's image sources, as anthropic 2.14's types define them --


@pytest.mark.parametrize(
    "source",
    [
        {"type": "url", "url": "https://example.com/cat.png"},
        {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"},
        {"type": "base64", "media_type": "image/png", "data": PNG_B64},
    ],
)
async def test_case_3_image_blocks_take_every_source_the_sdk_defines(gateway, source):
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=DEMO_KEY)
    message = await client.messages.create(
        **MESSAGE,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}],
            }
        ],
    )
    assert message.type == "message"
    assert sent(gateway)["messages"][0]["content"][0]["source"] == source


# -- cases 4 and 5: content generation, as google-genai (and pydantic-ai through it) sends it --


def content_client(gateway) -> genai.Client:
    return genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gateway.url))


async def test_case_4_a_tool_with_validated_function_calling_works(gateway):
    weather = genai_types.FunctionDeclaration(
        name="get_weather",
        description="The weather in a city",
        parameters={"type": "OBJECT", "properties": {"city": {"type": "STRING"}}},
    )
    config = genai_types.GenerateContentConfig(
        tools=[genai_types.Tool(function_declarations=[weather])],
        tool_config=genai_types.ToolConfig(
            function_calling_config=genai_types.FunctionCallingConfig(
                mode=genai_types.FunctionCallingConfigMode.VALIDATED
            )
        ),
    )
    answer = await content_client(gateway).aio.models.generate_content(
        model="genmodel-2.0-flash", contents="Weather in Paris?", config=config
    )
    assert answer.candidates
    assert sent(gateway)["toolConfig"] == {"functionCallingConfig": {"mode": "VALIDATED"}}


async def test_case_5_newer_harm_categories_work(gateway):
    categories = [
        c
        for c in genai_types.HarmCategory
        if c.name == "HARM_CATEGORY_JAILBREAK" or c.name.startswith("HARM_CATEGORY_IMAGE_")
    ]
    assert len(categories) >= 2
    config = genai_types.GenerateContentConfig(
        safety_settings=[
            genai_types.SafetySetting(category=c, threshold=genai_types.HarmBlockThreshold.BLOCK_ONLY_HIGH)
            for c in categories
        ]
    )
    answer = await content_client(gateway).aio.models.generate_content(
        model="genmodel-2.0-flash", contents="Hello", config=config
    )
    assert answer.text
    assert [s["category"] for s in sent(gateway)["safetySettings"]] == [c.value for c in categories]


# -- case 6: both version headers --

MESSAGE_CONFIG = "channels: [{name: simulator, base_url: simulator%s}]\n"


async def test_case_6_the_sdk_with_the_interfaces_version_header_set_too_works(gateway):
    client = anthropic.Anthropic(
        api_key=DEMO_KEY, base_url=gateway.url, default_headers={"msgapi-version": "2023-06-01"}
    )
    message = await asyncio.to_thread(
        client.messages.create, **MESSAGE, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message.content[0].text
    upstream = gateway.last_upstream_request()
    # The SDK sends its own anthropic-version (another value) on every call: the interface's wins.
    assert upstream.header("msgapi-version") == "2023-06-01" and upstream.header("anthropic-version") is None


@pytest.mark.parametrize(
    ("setting", "upstream_header"),
    [
        ("", "msgapi-version"),
        (", version_header: anthropic-version", "anthropic-version"),
        (", version_header: msgapi-version", "msgapi-version"),
    ],
)
@pytest.mark.parametrize("strict", [False, True])
async def test_case_6_when_both_version_headers_come_the_interfaces_goes_upstream(
    start_gateway, http, setting, upstream_header, strict
):
    gw = await start_gateway(MESSAGE_CONFIG % setting + ("server: {strict_interface: true}\n" if strict else ""))
    headers = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01", "anthropic-version": "2099-01-01"}
    body = {**MESSAGE, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(gw.url + "/v1/messages", json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
    got = {name.lower(): value for name, value in gw.last_upstream_request().headers}
    assert got[upstream_header] == "2023-06-01"
    assert ({"msgapi-version", "anthropic-version"} - {upstream_header}).isdisjoint(got)


async def test_case_6_both_headers_with_one_value_both_go_to_a_channel_that_names_none(gateway, http):
    """An upstream that reads either header (a channel without `version_header`) finds the version."""
    headers = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01", "anthropic-version": "2023-06-01"}
    body = {**MESSAGE, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(gateway.url + "/v1/messages", json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
    got = {name.lower(): value for name, value in gateway.last_upstream_request().headers}
    assert got["msgapi-version"] == got["anthropic-version"] == "2023-06-01"


# -- case 7: unknown paths under /v1/responses/ --


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/responses/input_tokens"),
        ("POST", "/v1/responses/compact"),
        ("GET", "/v1/responses/x/y/z"),
        ("DELETE", "/v1/responses/resp_1/input_items"),
        ("GET", "/v1/responses/resp_1/cancel"),
        ("POST", "/v1/responses/resp_1/input_items"),
        ("PUT", "/v1/responses/resp_1"),
        ("DELETE", "/v1/responses/"),
    ],
)
async def test_case_7_an_unknown_path_under_responses_is_the_formats_404(gateway, http, method, path):
    async with http.request(
        method, gateway.url + path, json={"model": "respmodel-4o", "input": "hi"}, headers=BEARER
    ) as answer:
        assert answer.status == 404, await answer.text()
        error = (await answer.json())["error"]
    assert error["type"] == "not_found_error" and error["code"] == "not_found" and "Allow" not in answer.headers
    assert len(gateway.sim().requests) == 0


async def test_case_7_the_sdks_token_count_is_a_not_found_error(gateway):
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    with pytest.raises(openai.NotFoundError):
        await client.responses.input_tokens.count(model="respmodel-4o", input="one two three")


async def test_case_7_the_real_routes_still_answer_and_the_interfaces_405_stays(gateway, http):
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY)
    made = await client.responses.create(model="respmodel-4o", input="Hello", background=True)
    assert (await client.responses.retrieve(made.id)).id == made.id
    assert [item async for item in client.responses.input_items.list(made.id)]
    await client.responses.cancel(made.id)
    await client.responses.delete(made.id)
    async with http.get(gateway.url + "/v1/responses", headers=BEARER) as answer:  # endpoint 11 takes POST only
        assert answer.status == 405 and answer.headers["Allow"] == "POST"
    async with http.get(gateway.url + "/v1/video/generations/task_1/x", headers=BEARER) as answer:
        assert answer.status == 404


# -- an unlisted value: counted, logged once, forwarded as the client wrote it --


async def scrape(http, url: str) -> dict[tuple[str, str], float]:
    async with http.get(url + "/metrics") as answer:
        text = await answer.text()
    return {
        (s.labels["route"], s.labels["field"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "modelgate_validation_unknown_values"
        for s in family.samples
        if s.name.endswith("_total")
    }


async def test_an_unlisted_value_is_counted_by_field_and_logged_once(gateway, http, caplog):
    first, second = f"effort-{uuid.uuid4().hex}", f"effort-{uuid.uuid4().hex}"
    before = await scrape(http, gateway.admin)
    with caplog.at_level(logging.INFO, logger="modelgate.validation"):
        for effort in (first, first, second):
            async with http.post(
                gateway.url + "/v1/responses",
                headers=BEARER,
                json={**RESPONSE, "reasoning": {"effort": effort}, "service_tier": "auto"},
            ) as answer:
                assert answer.status == 200
    after = await scrape(http, gateway.admin)
    key = ("responses", "reasoning.effort")
    assert after[key] - before.get(key, 0) == 3
    assert {field for _, field in after} <= OPEN_FIELDS  # labels are declared fields, never values
    logged = [r for r in caplog.records if r.name == "modelgate.validation" and getattr(r, "field", None)]
    assert [(r.field, r.value, r.route) for r in logged] == [
        ("reasoning.effort", first, "responses"),
        ("reasoning.effort", second, "responses"),
    ]


async def test_a_logged_value_is_escaped_once_cut_short_and_names_its_request(spawn):
    gw = spawn("defaults")
    hostile = f"x\x00y\r\n\u202e\\{uuid.uuid4().hex}" + "z" * 200
    async with aiohttp.ClientSession() as http:
        async with http.post(
            gw.url + "/v1/responses", headers=BEARER, json={**RESPONSE, "truncation": hostile}
        ) as answer:
            assert answer.status == 200
            request_id = answer.headers["X-Request-Id"]
    gw.proc.terminate()
    gw.proc.wait(timeout=20)
    lines = [orjson.loads(line) for line in gw.log.read_text().splitlines() if line.startswith("{")]
    [line] = [line for line in lines if line.get("field") == "truncation"]
    assert line["logger"] == "modelgate.validation" and line["route"] == "responses"
    assert line["request_id"] == request_id and line["key_name"] == "demo"
    # Shown as proxy/observability/safe_text.py shows client text, once: one backslash an escape,
    # two for the backslash the client sent.
    assert line["value"].startswith("x\\x00y\\r\\n\\u202e\\\\") and line["value"].endswith("...")
    assert len(line["value"]) < 110


async def test_a_request_counts_all_its_unlisted_values_and_logs_a_few(gateway, http, caplog):
    flood = [f"include-{n}-{uuid.uuid4().hex}" for n in range(MOST_UNLISTED - 10)]
    later = f"include-later-{uuid.uuid4().hex}"
    before = await scrape(http, gateway.admin)
    with caplog.at_level(logging.INFO, logger="modelgate.validation"):
        async with http.post(
            gateway.url + "/v1/responses",
            headers=BEARER,
            json={**RESPONSE, "include": [*flood, flood[0], "reasoning.encrypted_content"]},
        ) as answer:
            assert answer.status == 200, await answer.text()
            flood_id = answer.headers["X-Request-Id"]
        middle = await scrape(http, gateway.admin)
        async with http.post(
            gateway.url + "/v1/responses", headers=BEARER, json={**RESPONSE, "include": [later]}
        ) as answer:
            assert answer.status == 200
    after = await scrape(http, gateway.admin)
    key = ("responses", "include[]")
    assert middle[key] - before.get(key, 0) == len(flood) + 1  # each unlisted value, the repeated one too
    assert after[key] - middle[key] == 1
    logged = [r for r in caplog.records if getattr(r, "field", None) == "include[]"]
    # A few of the flood's, in the order sent; the flood did not use up the room the later value needed.
    assert [r.value for r in logged] == [*flood[:LOGGED_PER_REQUEST], later]
    assert {r.request_id for r in logged[:-1]} == {flood_id} and logged[-1].request_id != flood_id
    assert sent(gateway)["include"] == [later]


@pytest.mark.parametrize("count", [MOST_UNLISTED, MOST_UNLISTED + 1])
async def test_more_unlisted_values_than_the_bound_are_refused(gateway, http, count):
    # All fields together: one unlisted effort, the rest in include.
    body = {
        **RESPONSE,
        "reasoning": {"effort": "effort-of-tomorrow"},
        "include": [f"include-{n}" for n in range(count - 1)],
    }
    requests = len(gateway.sim().requests)
    async with http.post(gateway.url + "/v1/responses", headers=BEARER, json=body) as answer:
        if count == MOST_UNLISTED:
            assert answer.status == 200, await answer.text()
            return
        assert answer.status == 400
        error = (await answer.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "include[]"
    assert f"more than {MOST_UNLISTED} values" in error["message"]
    assert len(gateway.sim().requests) == requests  # never sent upstream


async def test_the_bound_holds_in_the_message_format_too(gateway, http):
    body = {**MESSAGE, "messages": [{"role": f"role-{n}", "content": "hi"} for n in range(MOST_UNLISTED + 1)]}
    async with http.post(gateway.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 400
        error = await answer.json()
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(f"messages[].role: the body carries more than {MOST_UNLISTED}")


def test_the_values_remembered_for_the_log_are_bounded_by_field():
    seen = FirstSeen(most=2)
    assert [seen.first("f", v) for v in ("a", "a", "b", "c", "a", "d")] == [True, False, True, False, False, False]
    assert seen.first("g", "c")  # a flood in one field leaves the others room
    assert seen.full == {"f"} and seen.seen == {"f": {"a", "b"}, "g": {"c"}}


async def test_an_unlisted_value_in_a_form_passes_and_is_counted_once(gateway, http):
    before = await scrape(http, gateway.admin)
    data = form(
        ("model", "imagegen-2", None),
        ("prompt", "edit", None),
        ("input_fidelity", "exact", None),
        ("image", png(64, 64), "a.png"),
    )
    async with http.post(gateway.url + "/v1/images/edits", data=data, headers=BEARER) as answer:
        assert answer.status == 200, await answer.text()
    after = await scrape(http, gateway.admin)
    assert after[("image_edits", "input_fidelity")] - before.get(("image_edits", "input_fidelity"), 0) == 1


async def test_strict_enums_refuse_an_unlisted_value_in_a_form(start_gateway, http):
    gw = await start_gateway("validation: {strict_enums: true}\n")
    data = form(
        ("model", "imagegen-2", None),
        ("prompt", "edit", None),
        ("input_fidelity", "exact", None),
        ("image", png(64, 64), "a.png"),
    )
    async with http.post(gw.url + "/v1/images/edits", data=data, headers=BEARER) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["param"] == "input_fidelity"


async def test_an_unlisted_value_survives_the_gateway_encoding_the_body_again(start_gateway, http):
    # A renamed model makes the gateway send a body it encoded itself: the value must be the client's.
    gw = await start_gateway("channels: [{name: simulator, base_url: simulator, rename: {respmodel-4o: up-4o}}]\n")
    raw = b'{"model":"respmodel-4o","input":"hi","reasoning":{"effort":"ne\\u0077\\u2028\xc3\xa9\\"\\\\\\/\xf0\x9f\x98\x80"}}'
    await post_raw_response(http, gw, raw)
    upstream = sent(gw)
    assert upstream["model"] == "up-4o"  # encoded again, indeed
    assert (
        upstream["reasoning"]["effort"] == orjson.loads(raw)["reasoning"]["effort"] == 'new\u2028\u00e9"\\/\U0001f600'
    )


async def test_a_message_value_of_tomorrow_passes_in_every_shape(gateway, http):
    # A tool_result holding a document, a role the SDK added, an image type the interface does not list.
    body = {
        **MESSAGE,
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
                        ],
                    },
                    {"type": "image", "source": {"type": "base64", "media_type": "image/avif", "data": PNG_B64}},
                ],
            },
        ],
    }
    async with http.post(gateway.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 200, await answer.text()
    assert sent(gateway)["messages"] == body["messages"]


# -- a checked name given twice: the upstream reads what was checked --


async def test_a_closed_field_given_twice_goes_upstream_as_checked(gateway, http):
    """The gateway's parser keeps a name's last value; an upstream's may keep the first."""
    raw = b'{"model":"respmodel-4o","input":"hi","service_tier":"gold","service_tier":"priority"}'
    await post_raw_response(http, gateway, raw)
    assert gateway.last_upstream_request().body.count(b"service_tier") == 1
    assert sent(gateway)["service_tier"] == "priority"


async def test_with_strict_enums_every_body_goes_upstream_as_checked(start_gateway, http):
    gw = await start_gateway("validation: {strict_enums: true}\n")
    raw = b'{"model":"respmodel-4o","input":"hi","reasoning":{"effort":"ultra","effort":"low"}}'
    await post_raw_response(http, gw, raw)
    assert b"ultra" not in gw.last_upstream_request().body
    assert sent(gw)["reasoning"] == {"effort": "low"}


# -- what the SDKs' own types allow, beyond the enumerations (found trying the newest SDKs) --


async def test_google_genai_s_float_top_k_reaches_the_upstream(gateway):
    # The SDK types top_k as a float: top_k=40 goes out as 40.0.
    answer = await content_client(gateway).aio.models.generate_content(
        model="genmodel-2.0-flash", contents="Hello", config=genai_types.GenerateContentConfig(top_k=40)
    )
    assert answer.text
    assert sent(gateway)["generationConfig"]["topK"] == 40


async def test_a_response_schema_with_a_union_reaches_the_upstream(gateway, http):
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int | str

    # The SDK writes the union as `any_of` with no type, in snake case.
    answer = await content_client(gateway).aio.models.generate_content(
        model="genmodel-2.0-flash",
        contents="A value",
        config=genai_types.GenerateContentConfig(response_mime_type="application/json", response_schema=Answer),
    )
    assert answer.text
    schema = sent(gateway)["generationConfig"]
    schema = schema.get("responseSchema") or schema["response_schema"]
    union = schema["properties"]["value"]
    assert "type" not in union and len(union.get("anyOf") or union["any_of"]) == 2
    body = {
        "contents": [{"parts": [{"text": "A value"}]}],
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"a": {"anyOf": [{"type": "STRING"}, {"type": 3}]}}},
        },
    }
    async with http.post(
        gateway.url + "/v1beta/models/genmodel-2.0-flash:generateContent",
        json=body,
        headers={"x-goog-api-key": DEMO_KEY},
    ) as refused:
        assert refused.status == 400  # the union's members are still schemas, checked
        assert "anyOf[1].type" in (await refused.json())["error"]["message"]


async def test_a_tool_result_without_content_reaches_the_upstream(gateway):
    client = anthropic.AsyncAnthropic(api_key=DEMO_KEY, base_url=gateway.url)
    message = await client.messages.create(
        **MESSAGE,
        messages=[
            {"role": "user", "content": "Run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    )
    assert message.content
    assert sent(gateway)["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "t1"}]


@pytest.mark.parametrize(
    "instead",
    [
        {"prompt": {"id": "pmpt_123", "version": "2", "variables": {"city": "Paris"}}},
        {"conversation": "conv_123"},
        {"previous_response_id": "resp_123"},
    ],
)
async def test_a_response_without_input_but_with_what_gives_it_is_not_refused(gateway, http, instead):
    async with http.post(
        gateway.url + "/v1/responses", json={"model": "respmodel-4o", **instead}, headers=BEARER
    ) as answer:
        assert answer.status != 400, await answer.text()
        if "previous_response_id" in instead:  # an id nobody here handed out: not found, as ever
            assert answer.status == 404
            return
    assert {k: v for k, v in sent(gateway).items() if k in instead} == instead


async def test_a_response_with_nothing_to_read_is_still_a_400(gateway, http):
    async with http.post(gateway.url + "/v1/responses", json={"model": "respmodel-4o"}, headers=BEARER) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["message"].startswith("input: is required")


async def test_a_response_stream_the_upstream_broke_raises_the_gateway_s_message_in_the_sdk(gateway):
    client = openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=DEMO_KEY, default_headers={"x-sim-fault": "drop-after=3"}
    )
    with pytest.raises(openai.APIError, match="upstream closed the stream before it finished"):
        async with client.responses.stream(model="respmodel-4o", input="Tell me a long story") as stream:
            async for _ in stream:
                pass


@pytest.mark.parametrize(
    ("strict", "again"),
    [
        (False, b'"service_tier":"auto","service_tier":"auto"'),
        (True, b'"service_tier":"auto"'),
        (False, b'"\\u0061":1'),
    ],
)
async def test_a_body_too_deep_to_encode_again_is_a_400_not_a_500(start_gateway, http, strict, again):
    """Legal JSON 300 levels deep, in a body the gateway must encode again (a closed field named
    twice; every body under strict_enums; a name spelled with an escape, before any plugin): its
    encoder stops at 254 levels, where the parser did not."""
    gw = await start_gateway("validation: {strict_enums: true}\n" if strict else None)
    raw = b'{"model":"respmodel-4o","input":"hi",' + again + b',"x":' + b"[" * 300 + b"]" * 300 + b"}"
    async with http.post(
        gw.url + "/v1/responses", data=raw, headers={**BEARER, "Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 400, await answer.text()
        assert "nested too deeply" in (await answer.json())["error"]["message"]
    assert not gw.sim().requests


async def test_a_content_field_given_in_both_spellings_is_refused(gateway, http):
    """One spelling is checked; the other went upstream unchecked (strict mode and the gateway's
    own delivery switch passed that way)."""
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "generationConfig": {},
        "generation_config": {"temperature": 99, "responseFormat": {"image": {"delivery": "bogus"}}},
    }
    async with http.post(
        gateway.url + "/v1beta/models/genmodel-2.0-flash:generateContent",
        json=body,
        headers={"x-goog-api-key": DEMO_KEY},
    ) as answer:
        assert answer.status == 400
        assert "given as both generationConfig and generation_config" in (await answer.json())["error"]["message"]
    assert not gateway.sim().requests


@pytest.mark.parametrize(
    "size", ["３８４０x２１６０", "\u0663\u0668\u0664\u0660x\u0662\u0661\u0666\u0660", "1024x1024\n", "0001024x0001024"]
)
async def test_a_custom_size_is_written_in_plain_digits(gateway, http, size):
    async with http.post(
        gateway.url + "/v1/images/generations",
        headers=BEARER,
        json={"model": "imagegen-2", "prompt": "a cat", "size": size},
    ) as answer:
        assert answer.status == 400, await answer.text()
        assert (await answer.json())["error"]["param"] == "size"


async def test_an_empty_version_header_is_no_version_and_is_not_forwarded(gateway, http):
    headers = {"x-api-key": DEMO_KEY, "msgapi-version": "", "anthropic-version": "2023-06-01"}
    async with http.post(
        gateway.url + "/v1/messages", headers=headers, json={**MESSAGE, "messages": [{"role": "user", "content": "hi"}]}
    ) as answer:
        assert answer.status == 200, await answer.text()
    upstream = gateway.last_upstream_request()
    assert upstream.header("anthropic-version") == "2023-06-01" and upstream.header("msgapi-version") is None


@pytest.mark.parametrize(
    "lines",
    [
        [("msgapi-version", "2023-06-01"), ("msgapi-version", "2025-01-01")],
        [("msgapi-version", "2023-06-01, 2025-01-01")],
    ],
)
async def test_one_version_header_with_two_values_is_refused(gateway, http, lines):
    headers = [("x-api-key", DEMO_KEY), ("Content-Type", "application/json"), *lines]
    async with http.post(
        gateway.url + "/v1/messages",
        headers=headers,
        data=orjson.dumps({**MESSAGE, "messages": [{"role": "user", "content": "hi"}]}),
    ) as answer:
        assert answer.status == 400, await answer.text()
        assert "different values" in (await answer.json())["error"]["message"]
    assert not gateway.sim().requests


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/responses", {**RESPONSE, "service_tier": "auto", "\u017fervice_tier": "priority"}, "service_tier"),
        ("/v1/responses", {**RESPONSE, "Max_output_tokens": 100000}, "max_output_tokens"),
        ("/v1/images/generations", {"model": "imagegen-2", "prompt": "a cat", "n": 1, "N": 10}, "n"),
        ("/v1/images/generations", {"model": "imagegen-2", "prompt": "a cat", "QUALITY": "high"}, "quality"),
        (
            "/v1beta/models/genmodel-2.0-flash:generateContent",
            {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"CandidateCount": 8}},
            "generationConfig.candidateCount",
        ),
        (
            "/v1/video/generations",
            {"model": "videogen-3.0-generate-001", "prompt": "waves", "metadata": {"SampleCount": 4}},
            "metadata.sampleCount",
        ),
    ],
)
async def test_a_checked_field_in_other_letter_case_is_refused(gateway, http, path, body, field):
    """A case-insensitive upstream reads the value the gateway neither checked nor reserved for."""
    headers = {"x-goog-api-key": DEMO_KEY} if "generateContent" in path else BEARER
    async with http.post(gateway.url + path, json=body, headers=headers) as answer:
        assert answer.status == 400, await answer.text()
        assert f"{field}: given in other letter case" in await answer.text()
    assert not gateway.sim().requests


async def test_a_response_s_own_metadata_and_a_tool_s_properties_may_name_anything(gateway, http):
    body = {
        **RESPONSE,
        "metadata": {"Size": "large", "N": "3"},
        "tools": [
            {
                "type": "function",
                "name": "f",
                "parameters": {"type": "object", "properties": {"Quality": {"type": "string"}}},
            }
        ],
    }
    async with http.post(gateway.url + "/v1/responses", json=body, headers=BEARER) as answer:
        assert answer.status == 200, await answer.text()


@pytest.mark.parametrize(("beta", "status"), [(None, 400), ("interleaved-thinking-2025-05-14", 200)])
async def test_a_thinking_budget_past_max_tokens_passes_with_interleaved_thinking(gateway, http, beta, status):
    headers = {**MESSAGE_HEADERS, **({"anthropic-beta": beta} if beta else {})}
    async with http.post(
        gateway.url + "/v1/messages",
        headers=headers,
        json={
            "model": "msgmodel-sonnet-4-5",
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 4096},
            "messages": [{"role": "user", "content": "hi"}],
        },
    ) as answer:
        assert answer.status == status, await answer.text()
