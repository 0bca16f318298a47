"""What a trace of one request holds, as a collector receives it from a gateway process: the
server span, each working plugin's hook, each upstream attempt and the stream, with the gen_ai
semantic conventions' attributes; spans a third-party plugin starts through the OpenTelemetry
API under the request's; both OTLP/HTTP encodings; head sampling, with errors and slow requests
kept whatever the sampler decided."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.conftest import MESSAGE_HEADERS
from tests.otlp_collector import Collector, attributes, collector  # noqa: F401 (a fixture)
from tests.polling import within

STREAM = {
    "model": "msgmodel-haiku-4-5",
    "max_tokens": 8,
    "stream": True,
    "messages": [{"role": "user", "content": "a"}],
}
SERVER, CLIENT = 2, 3


def gateway_config(collector: Collector, tracing: str = "", more: str = "") -> str:
    return f"observability: {{tracing: {{exporter: otlp, endpoint: '{collector.url}'{tracing}}}}}\n{more}\n"


async def one_trace(collector: Collector) -> list[dict]:
    """The spans of the one request's trace, once its server span has arrived."""
    await within(10, lambda: _has_server(collector), "the request's spans at the collector")
    server = next(span for span in collector.spans() if span["kind"] == SERVER)
    return [span for span in collector.spans() if span["traceId"] == server["traceId"]]


async def _has_server(collector: Collector) -> bool:
    return any(span["kind"] == SERVER for span in collector.spans())


async def test_a_streamed_request_is_one_trace_of_its_server_span_hooks_attempt_and_stream(
    start_gateway, http, collector
):
    gw = await start_gateway(gateway_config(collector))
    async with http.post(
        gw.url + "/v1/messages", json=STREAM, headers={**MESSAGE_HEADERS, "x-sim-output-tokens": "3"}
    ) as answer:
        assert answer.status == 200
        await answer.read()
    spans = await one_trace(collector)
    server = next(span for span in spans if span["kind"] == SERVER)
    said = attributes(server)
    assert server["name"] == "POST /v1/messages" and "parentSpanId" not in server
    assert said["gen_ai.operation.name"] == "chat"
    assert said["gen_ai.request.model"] == "msgmodel-haiku-4-5"
    assert said["gen_ai.usage.input_tokens"] >= 1 and said["gen_ai.usage.output_tokens"] == 3
    assert said["gen_ai.response.id"].startswith("msg_")
    assert said["http.response.status_code"] == 200 and said["modelgate.key_name"] == "demo"
    names = {span["name"] for span in spans}
    assert {"auth on_request", "validation on_request", "sse on_event", "stream"} <= names
    (attempt,) = [span for span in spans if span["kind"] == CLIENT]
    assert attempt["name"] == "POST upstream simulator"
    assert attributes(attempt)["http.response.status_code"] == 200
    assert attributes(attempt)["gen_ai.request.model"] == "msgmodel-haiku-4-5"
    stream = next(span for span in spans if span["name"] == "stream")
    assert attributes(stream)["modelgate.events"] >= 5 and attributes(stream)["modelgate.first_event_ms"] > 0
    assert all(span["parentSpanId"] == server["spanId"] for span in spans if span is not server)
    upstream = gw.last_upstream_request().header("traceparent")
    assert upstream == f"00-{server['traceId']}-{attempt['spanId']}-01"


async def test_each_attempt_of_a_failover_is_a_span_and_the_first_says_why_it_failed(start_gateway, http, collector):
    gw = await start_gateway(
        gateway_config(
            collector,
            more="resilience: {backoff_s: 0.01}\n"
            "channels: [{name: dead, base_url: 'http://127.0.0.1:1', priority: 0},"
            " {name: simulator, base_url: simulator, priority: 1}]",
        )
    )
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    async with http.post(gw.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 200
    spans = await one_trace(collector)
    attempts = sorted((span for span in spans if span["kind"] == CLIENT), key=lambda span: span["startTimeUnixNano"])
    assert [span["name"] for span in attempts] == ["POST upstream dead", "POST upstream simulator"]
    assert [attributes(span)["modelgate.attempt"] for span in attempts] == [1, 2]
    assert attributes(attempts[1])["http.response.status_code"] == 200
    server = next(span for span in spans if span["kind"] == SERVER)
    assert attributes(server)["modelgate.backoff_ms"] >= 10


async def test_a_third_party_plugin_s_own_span_is_a_child_of_the_request_s(spawn, collector):
    # A process of its own: the OpenTelemetry API's global provider is set once a process.
    gw = spawn(
        "gateway",
        config="server: {listen: '127.0.0.1:{PORT}'}\n"
        + gateway_config(
            collector, more="routes: {messages: {plugins: [auth, validation, tests.recording_plugin:Traced, usage]}}"
        ),
    )
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(gw.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
                assert answer.status == 200
    await within(10, lambda: _count(collector, SERVER, 3), "the requests' spans")
    await within(10, lambda: _named(collector, "a lookup of its own", 3), "the plugin's spans")
    servers = {span["spanId"]: span for span in collector.spans() if span["kind"] == SERVER}
    own = sorted(
        ((scope, span) for scope, span in collector.scoped() if span["name"] == "a lookup of its own"),
        key=lambda found: int(found[1]["startTimeUnixNano"]),
    )
    assert {scope for scope, _ in own} == {"tests.traced"}
    assert all(attributes(span)["lookup.hit"] is True for _, span in own)
    # The first may start before anything in the process asked for a tracer (the request's context
    # is attached only once something has): each after it is its request's child.
    for _, span in own[1:]:
        assert servers[span["parentSpanId"]]["traceId"] == span["traceId"]


async def _count(collector: Collector, kind: int, wanted: int) -> bool:
    return sum(span["kind"] == kind for span in collector.spans()) >= wanted


async def _named(collector: Collector, name: str, wanted: int) -> bool:
    return sum(span["name"] == name for span in collector.spans()) >= wanted


async def test_protobuf_carries_the_same_trace(start_gateway, http, collector):
    gw = await start_gateway(gateway_config(collector, ", protocol: http/protobuf, compression: gzip"))
    async with http.post(gw.url + "/v1/messages", json=STREAM, headers=MESSAGE_HEADERS) as answer:
        await answer.read()
    spans = await one_trace(collector)
    headers, _ = collector.posts[0]
    assert headers["Content-Type"] == "application/x-protobuf" and headers["Content-Encoding"] == "gzip"
    server = next(span for span in spans if span["kind"] == SERVER)
    assert attributes(server)["gen_ai.request.model"] == "msgmodel-haiku-4-5"
    assert {"auth on_request", "stream", "POST upstream simulator"} <= {span["name"] for span in spans}


async def test_the_sampler_leaves_requests_out_but_an_error_or_a_slow_one_is_kept(start_gateway, http, collector):
    gw = await start_gateway(
        gateway_config(collector, ", sample_ratio: 0.0, keep_errors: true, keep_slower_than_ms: 300")
    )
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    statuses = []
    for headers in ({}, {"x-sim-fault": "status=500"}, {"x-sim-latency-ms": "400"}):
        async with http.post(gw.url + "/v1/messages", json=body, headers={**MESSAGE_HEADERS, **headers}) as answer:
            await answer.read()
            statuses.append(answer.status)
    assert statuses[0] == statuses[2] == 200 and statuses[1] >= 500
    await within(10, lambda: _count(collector, SERVER, 2), "the kept requests' spans")
    await asyncio.sleep(1.5)  # an export interval more: nothing else comes
    servers = [span for span in collector.spans() if span["kind"] == SERVER]
    assert sorted(attributes(span)["http.response.status_code"] for span in servers) == [200, statuses[1]]
    failed = next(span for span in servers if attributes(span)["http.response.status_code"] >= 500)
    assert failed["status"]["code"] == 2  # an error, and said why
    # Unsampled at its head: what went upstream said so, for the upstream's own tracing.
    assert gw.last_upstream_request().header("traceparent").endswith("-00")


async def test_a_traced_request_s_latency_buckets_name_its_trace_in_the_openmetrics_scrape(
    start_gateway, http, collector
):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    gw = await start_gateway(gateway_config(collector))
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    async with http.post(gw.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
        assert answer.status == 200
    spans = await one_trace(collector)
    trace_id = next(span for span in spans if span["kind"] == SERVER)["traceId"]
    async with http.get(
        gw.admin + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    ) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await answer.text()
    exemplars = {
        family.name: {sample.exemplar.labels["trace_id"] for sample in family.samples if sample.exemplar is not None}
        for family in text_string_to_metric_families(text)
    }
    for family in (
        "modelgate_request_duration_seconds",
        "modelgate_overhead_seconds",
        "modelgate_upstream_ttfb_seconds",
    ):
        assert trace_id in exemplars[family], family  # a dashboard goes from the bucket to this trace
    async with http.get(gw.admin + "/metrics") as answer:  # a scraper that asks for nothing gets the text format
        assert answer.headers["Content-Type"].startswith("text/plain") and "# EOF" not in await answer.text()


async def test_a_reload_retunes_sampling_at_once_and_says_an_exporter_change_waits_for_a_restart(
    start_gateway, http, collector, caplog
):
    from pathlib import Path

    gw = await start_gateway(gateway_config(collector, ", sample_ratio: 0.0, keep_errors: false"))
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}

    async def send() -> None:
        async with http.post(gw.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
            assert answer.status == 200

    await send()
    await asyncio.sleep(1.2)  # an export interval: nothing was sampled
    assert collector.spans() == []
    assert gw.owner.config_path is not None
    Path(gw.owner.config_path).write_text(gateway_config(collector, ", sample_ratio: 1.0, protocol: http/protobuf"))
    assert await gw.owner.reload() is True
    assert any("observability.tracing.protocol" in r.getMessage() for r in caplog.records)  # at the next restart
    await send()
    spans = await one_trace(collector)  # sampled from the reload on, still exported as JSON
    assert spans and collector.posts[0][0]["Content-Type"] == "application/json"


async def test_an_attempt_the_upstream_answered_5xx_is_a_failed_span(start_gateway, http, collector):
    gw = await start_gateway(gateway_config(collector))
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    async with http.post(
        gw.url + "/v1/messages", json=body, headers={**MESSAGE_HEADERS, "x-sim-fault": "status=500"}
    ) as answer:
        assert answer.status >= 500
    spans = await one_trace(collector)
    (attempt,) = [span for span in spans if span["kind"] == CLIENT]
    assert attributes(attempt)["http.response.status_code"] == 500 and attempt["status"]["code"] == 2


async def test_a_ledger_record_names_a_trace_only_when_the_trace_is_exported(start_gateway, http, collector, ledger_db):
    from tests.test_ledger import rows

    gw = await start_gateway(
        gateway_config(
            collector,
            ", sample_ratio: 0.0, keep_errors: true",
            more=f'plugins: {{ledger: {{database_url: "{ledger_db}", flush_interval_s: 0.1}}}}',
        )
    )
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    for fault in ({}, {"x-sim-fault": "status=500"}):
        async with http.post(gw.url + "/v1/messages", json=body, headers={**MESSAGE_HEADERS, **fault}) as answer:
            await answer.read()

    async def both() -> bool:
        return len(await rows(ledger_db)) == 2

    await within(10, both, "both requests' records")
    traced = {row["status"]: row["trace_id"] for row in await rows(ledger_db)}
    assert traced[200] is None  # sampled out: the console would link to nothing
    server = next(span for span in await one_trace(collector) if span["kind"] == SERVER)
    assert traced[max(traced)] == server["traceId"]  # kept as an error: its record leads to it


async def test_hostile_requests_are_traced_and_logged_like_any_other(start_gateway, http, collector, capfd):
    """From the review: a route of a format with no gen_ai operation (`GET /v1/models`, no key
    needed) once raised in the trace's start, leaving the request in flight for good; a Host
    header of bytes UTF-8 cannot hold made the export's encoding raise, and the access line went."""
    from tests.raw_http import send_raw

    gw = await start_gateway(gateway_config(collector))
    for _ in range(3):
        async with http.get(gw.url + "/v1/models") as answer:
            assert answer.status in (200, 401)
    body = b'{"model":"msgmodel-haiku-4-5","max_tokens":8,"messages":[{"role":"user","content":"a"}]}'
    raw = await send_raw(
        gw.url,
        b"POST /v1/messages HTTP/1.1\r\nHost: evil\xff\xfe.example\r\nx-api-key: sk-demo-key\r\n"
        b"msgapi-version: 2023-06-01\r\nContent-Type: application/json\r\nX-Request-Id: hostile-host\r\n"
        + b"Content-Length: %d"
        % len(body),
        body,
    )
    assert raw.status == 200
    await within(10, lambda: _count(collector, SERVER, 4), "every request's spans, the hostile one's too")
    server = next(span for span in collector.spans() if attributes(span).get("modelgate.request_id") == "hostile-host")
    assert attributes(server)["server.address"] == "evil??.example"  # what UTF-8 cannot hold, replaced
    async with http.get(gw.admin + "/metrics") as answer:
        text = await answer.text()
    assert 'modelgate_in_flight_requests{route="models"} 0.0' in text
    await asyncio.sleep(0.1)  # access lines are written once per loop pass
    assert '"request_id":"hostile-host"' in capfd.readouterr().err


def test_a_cached_attribute_is_never_found_for_a_value_of_another_type_or_a_long_one():
    from opentelemetry.sdk.resources import Resource

    from proxy.observability import otlp
    from proxy.observability.otlp import encode, records_json
    from proxy.observability.spans import RequestTrace, SpanRecord

    def encoded(value: object) -> dict:
        request = RequestTrace(1, True)
        record = SpanRecord(request, "step", 1, request.server_id, 0, {"plugin.value": value})
        record.end()
        body = json.loads(encode([], [records_json(request.finished)], Resource.create({})))
        return body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][0]["value"]

    assert encoded(1) == {"intValue": "1"}
    assert encoded(True) == {"boolValue": True} and encoded(1.0) == {"doubleValue": 1.0}
    held = len(otlp._REUSED)
    encoded("x" * 5000)
    assert len(otlp._REUSED) == held  # a client's long text is not kept
