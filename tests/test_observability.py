"""Metrics and traces: every hop measured, label values bounded, one trace per request across the upstream hop."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from proxy.observability.access_log import AccessLog
from proxy.observability.metrics import REQUESTS
from proxy.observability.tally import fold
from tests.polling import within

MSG = {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"}


def model_labels() -> set[str]:
    fold()  # the request path's tallies into the family, as a scrape does
    return {s.labels["model"] for family in REQUESTS.collect() for s in family.samples if s.name.endswith("_total")}


async def test_a_thousand_unknown_model_names_add_at_most_one_label_value(gateway, http):
    before = model_labels()
    for _ in range(1000):
        body = {
            "model": f"unheard-of-{uuid.uuid4().hex}",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
        }
        async with http.post(
            gateway.url + "/v1/messages", json=body, headers={**MSG, "x-sim-output-tokens": "1"}
        ) as answer:
            assert answer.status == 200
    assert len(model_labels() - before) <= 1
    assert "other" in model_labels()


async def scrape(http, url: str) -> dict[str, list]:
    async with http.get(url + "/metrics") as answer:
        assert answer.status == 200
        text = await answer.text()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


async def test_metrics_follow_requests_streams_tokens_and_refusals(gateway, http):
    before = await scrape(http, gateway.admin)
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a b"}]}
    async with http.post(
        gateway.url + "/v1/messages", json=body, headers={**MSG, "x-sim-output-tokens": "5"}
    ) as answer:
        await answer.read()
    async with http.post(
        gateway.url + "/v1/messages", json={**body, "stream": True}, headers={**MSG, "x-sim-output-tokens": "3"}
    ) as answer:
        await answer.read()
    async with http.post(gateway.url + "/v1/messages", json={**body, "max_tokens": 0}, headers=MSG) as answer:
        assert answer.status == 400
    async with http.post(gateway.url + "/v1/messages", json=body, headers={"msgapi-version": "1"}) as answer:
        assert answer.status == 401
    after = await scrape(http, gateway.admin)

    def delta(family: str, name: str, **labels: str) -> float:
        return value(after.get(family, []), name, **labels) - value(before.get(family, []), name, **labels)

    assert (
        delta(
            "modelgate_requests",
            "modelgate_requests_total",
            route="messages",
            model="msgmodel-haiku-4-5",
            channel="simulator",
            status_class="2xx",
        )
        == 2
    )
    assert delta("modelgate_requests", "modelgate_requests_total", route="messages", status_class="4xx") == 2
    assert (
        delta("modelgate_tokens", "modelgate_tokens_total", model="msgmodel-haiku-4-5", key="demo", direction="output")
        == 8
    )
    assert delta("modelgate_stream_events", "modelgate_stream_events_total", route="messages") == 8
    assert (
        delta("modelgate_stream_first_event_seconds", "modelgate_stream_first_event_seconds_count", route="messages")
        == 1
    )
    assert (
        delta(
            "modelgate_validation_failures", "modelgate_validation_failures_total", route="messages", rule="max_tokens"
        )
        == 1
    )
    assert (
        delta("modelgate_auth_refusals", "modelgate_auth_refusals_total", route="messages", reason="missing_api_key")
        == 1
    )
    assert delta("modelgate_overhead_seconds", "modelgate_overhead_seconds_count", route="messages") == 4
    assert value(after["modelgate_channel_up"], "modelgate_channel_up", channel="simulator") == 1
    assert value(after["modelgate_config_info"], "modelgate_config_info") >= 1


async def test_upstream_failures_are_counted_and_take_a_channel_down(start_gateway, http):
    gw = await start_gateway(
        "channels: [{name: flaky, base_url: simulator}]\nresilience: {breaker_failures: 3, breaker_open_s: 0.2}"
    )
    body = {"model": "respmodel-4o", "input": "x"}
    for _ in range(3):
        async with http.post(
            gw.url + "/v1/responses",
            json=body,
            headers={"Authorization": "Bearer sk-demo-key", "x-sim-fault": "status=503"},
        ) as answer:
            assert answer.status == 503
    metrics = await scrape(http, gw.admin)
    assert (
        value(
            metrics["modelgate_upstream_errors"], "modelgate_upstream_errors_total", channel="flaky", kind="status_5xx"
        )
        == 3
    )
    assert value(metrics["modelgate_channel_up"], "modelgate_channel_up", channel="flaky") == 0
    import asyncio

    await asyncio.sleep(0.3)  # the breaker's pause ends: one probe may go, and it succeeds
    async with http.post(
        gw.url + "/v1/responses", json=body, headers={"Authorization": "Bearer sk-demo-key"}
    ) as answer:
        assert answer.status == 200
    metrics = await scrape(http, gw.admin)
    assert value(metrics["modelgate_channel_up"], "modelgate_channel_up", channel="flaky") == 1


@pytest.fixture
async def traced():
    from aiohttp import web

    from proxy.process.app import APP_KEY, build_app
    from proxy.registry import load_config

    exporter = InMemorySpanExporter()
    app = build_app(load_config(None), None, span_exporter=exporter)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    yield url, exporter, app[APP_KEY]
    await runner.cleanup()


async def test_one_streaming_request_is_one_trace_across_every_hook_and_the_upstream(traced, http):
    url, exporter, owner = traced
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "a"}],
    }
    async with http.post(url + "/v1/messages", json=body, headers={**MSG, "x-sim-output-tokens": "3"}) as answer:
        await answer.read()
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(server) == 1
    trace_id = server[0].context.trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}
    names = {s.name for s in spans}
    assert {"auth on_request", "validation on_request", "sse on_event"} <= names
    client = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert len(client) == 1 and client[0].name == "POST upstream simulator"
    assert all(s.parent.span_id == server[0].context.span_id for s in spans if s is not server[0])
    received = owner.simulators.simulators["simulator"].requests[-1].header("traceparent")
    version, trace_hex, span_hex, flags = received.split("-")
    assert (version, trace_hex, span_hex) == ("00", f"{trace_id:032x}", f"{client[0].context.span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    attributes = server[0].attributes
    assert attributes["http.response.status_code"] == 200 and attributes["gen_ai.usage.output_tokens"] == 3
    assert next(s for s in spans if s.name == "sse on_event").attributes["modelgate.events"] == 8


async def test_an_attempt_s_span_says_what_the_upstream_answered_and_a_client_gone_is_no_upstream_error(
    traced, http
) -> None:
    url, exporter, _ = traced
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}
    streaming = {**MSG, "x-sim-chunk-delay-ms": "200", "x-sim-output-tokens": "20"}
    async with http.post(url + "/v1/messages", json={**body, "stream": True}, headers=streaming) as answer:
        await answer.content.readany()  # the stream has begun; the client leaves
    await within(5, lambda: any(s.kind is SpanKind.SERVER for s in exporter.get_finished_spans()), "the request's end")
    attempt = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT)
    assert attempt.status.status_code is not StatusCode.ERROR and not attempt.events  # no exception recorded
    assert attempt.attributes["modelgate.cancelled"] is True
    assert attempt.attributes["http.response.status_code"] == 200

    exporter.clear()  # an upstream refusing the channel's credential: the gateway answers (and opens the breaker)
    async with http.post(url + "/v1/messages", json=body, headers={**MSG, "x-sim-fault": "status=401"}) as answer:
        assert answer.status == 502 and "Server-Timing" in answer.headers
    attempt = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT)
    assert attempt.attributes["http.response.status_code"] == 401  # the upstream's, not the gateway's 502


async def test_an_incoming_traceparent_is_honoured(traced, http):
    url, exporter, _ = traced
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with http.post(
        url + "/v1/responses",
        json={"model": "respmodel-4o", "input": "x"},
        headers={"Authorization": "Bearer sk-demo-key", "traceparent": parent},
    ) as answer:
        assert answer.status == 200
    server = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert f"{server.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{server.parent.span_id:016x}" == "b7ad6b7169203331"


async def test_an_unsampled_request_records_nothing_but_passes_its_trace_on(traced, http, capfd):
    url, exporter, owner = traced
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"  # the caller did not sample it
    async with http.post(
        url + "/v1/messages",
        json={"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]},
        headers={**MSG, "traceparent": parent},
    ) as answer:
        assert answer.status == 200
    await asyncio.sleep(0.1)  # access lines are written once per loop pass, at most 50 ms late
    assert exporter.get_finished_spans() == ()
    received = owner.simulators.simulators["simulator"].requests[-1].header("traceparent")
    version, trace_hex, _, flags = received.split("-")
    assert (version, trace_hex, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "00")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if '"route"' in line]
    assert lines[-1]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_metric_families_are_registered_once():
    names = {m.name for m in REGISTRY.collect() if m.name.startswith("modelgate_")}
    assert {
        "modelgate_requests",
        "modelgate_overhead_seconds",
        "modelgate_streams_open",
        "modelgate_tokens",
        "modelgate_config_reloads",
        "modelgate_channel_up",
    } <= names


def test_access_lines_render_as_json_or_for_the_console(capfd):
    event = {"event": "request", "level": "info", "route": "messages", "status": 200, "duration_ms": 1.5}
    AccessLog("json").write(dict(event))
    AccessLog("console").write(dict(event))
    json_line, console_line = capfd.readouterr().err.splitlines()
    parsed = json.loads(json_line)
    assert {k: parsed[k] for k in event} == event
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", parsed["timestamp"])
    assert "request" in console_line and "route=messages" in console_line and "status=200" in console_line
