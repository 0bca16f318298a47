"""OTLP's encodings of finished spans: JSON (written here with orjson) and protobuf (the
opentelemetry-proto messages, through the SDK's encoder).

The SDK's encoder builds a protobuf object for every span, attribute and value (about 22 us a
span here); OTLP/HTTP receivers take JSON as well as protobuf (the protocol defines both), and
orjson writes it in a fraction of that. The gateway's own spans (proxy/observability/spans.py)
are encoded straight from their records; attribute pairs that repeat (a route, a method, a
model, a channel) are encoded once and reused.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy.observability.spans import SpanRecord

SCOPE = ("modelgate", __import__("proxy").__version__)  # the instrumentation scope of the gateway's own spans
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_SDK_KIND = {number: kind for kind, number in _KIND.items()}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: whether the parent's remoteness is known, and is it
_REUSED_MAX = 4096  # encoded attribute pairs kept for reuse; emptied when full
_REUSED_LONGEST = 200  # characters: a longer text is encoded each time


def encode(spans: Sequence[ReadableSpan], own: Sequence[bytes] = (), resource: Resource | None = None) -> bytes:
    """An ExportTraceServiceRequest in OTLP/JSON (ids in hex, 64-bit integers as strings): SDK
    spans grouped by their resource and scope, and the gateway's own spans, each request's as
    `records_json` wrote them, under `resource` and the gateway's scope."""
    if own and not spans and resource is not None:  # the gateway's spans alone: the envelope is written once
        prefix, suffix = _envelope(resource)
        parts = [prefix]
        for chunk in own:
            parts += (chunk, b",")
        parts[-1] = suffix  # (the last comma's place)
        return b"".join(parts)  # one copy of a batch that may be a megabyte
    resources: dict[int, dict[str, Any]] = {}
    if own:
        assert resource is not None
        resources[id(resource)] = {
            "resource": {"attributes": _attributes(resource.attributes)},
            "scopeSpans": [
                {
                    "scope": {"name": SCOPE[0], "version": SCOPE[1]},
                    "spans": orjson.Fragment(b"[" + b",".join(own) + b"]"),
                }
            ],
        }
        if resource.schema_url:
            resources[id(resource)]["schemaUrl"] = resource.schema_url
    groups: dict[tuple[int, int], tuple[ReadableSpan, list[dict[str, Any]]]] = {}
    for span in spans:
        key = (id(span.resource), id(span.instrumentation_scope))
        group = groups.get(key)
        if group is None:
            group = groups[key] = (span, [])
        group[1].append(_span(span))
    for first, encoded in groups.values():
        resource = first.resource
        entry = resources.get(id(resource))
        if entry is None:
            entry = resources[id(resource)] = {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [],
            }
            if resource.schema_url:
                entry["schemaUrl"] = resource.schema_url
        entry["scopeSpans"].append(_scope_spans(first, encoded))
    return orjson.dumps({"resourceSpans": list(resources.values())})


_ENVELOPES: dict[int, tuple[Resource, tuple[bytes, bytes]]] = {}


def _envelope(resource: Resource) -> tuple[bytes, bytes]:
    """What goes before and after the gateway's own spans in a request of them alone."""
    found = _ENVELOPES.get(id(resource))
    if found is None or found[0] is not resource:
        marker = "\x00spans\x00"
        whole = orjson.dumps(
            {
                "resourceSpans": [
                    {
                        "resource": {"attributes": _attributes(resource.attributes)},
                        "scopeSpans": [{"scope": {"name": SCOPE[0], "version": SCOPE[1]}, "spans": marker}],
                        **({"schemaUrl": resource.schema_url} if resource.schema_url else {}),
                    }
                ]
            }
        )
        before, after = whole.split(orjson.dumps(marker))
        found = _ENVELOPES[id(resource)] = (resource, (before + b"[", b"]" + after))
    return found[1]


def _scope_spans(first: ReadableSpan, spans: list[dict[str, Any]]) -> dict[str, Any]:
    scope = first.instrumentation_scope
    if scope is None:
        return {"scope": {}, "spans": spans}
    encoded: dict[str, Any] = {"name": scope.name}
    if scope.version:
        encoded["version"] = scope.version
    if scope.attributes:
        encoded["attributes"] = _attributes(scope.attributes)
    group = {"scope": encoded, "spans": spans}
    if scope.schema_url:
        group["schemaUrl"] = scope.schema_url
    return group


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.context
    parent = span.parent
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": _KIND[span.kind],
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "flags": _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0),
    }
    if context.trace_state:
        encoded["traceState"] = context.trace_state.to_header()
    if parent is not None:
        encoded["parentSpanId"] = f"{parent.span_id:016x}"
    if span.attributes:
        encoded["attributes"] = _attributes(span.attributes)
    if span.events:
        encoded["events"] = [_event(event) for event in span.events]
    if span.links:
        encoded["links"] = [_link(link) for link in span.links]
    status = span.status
    encoded["status"] = (
        {"code": status.status_code.value, "message": status.description}
        if status.description
        else ({"code": status.status_code.value} if status.status_code.value else {})
    )
    for name, count in (
        ("droppedAttributesCount", span.dropped_attributes),
        ("droppedEventsCount", span.dropped_events),
        ("droppedLinksCount", span.dropped_links),
    ):
        if count:
            encoded[name] = count
    return encoded


def _event(event: Any) -> dict[str, Any]:
    encoded: dict[str, Any] = {"timeUnixNano": str(event.timestamp), "name": event.name}
    if event.attributes:
        encoded["attributes"] = _attributes(event.attributes)
    if event.dropped_attributes:
        encoded["droppedAttributesCount"] = event.dropped_attributes
    return encoded


def _link(link: Any) -> dict[str, Any]:
    context = link.context
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "flags": _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0),
    }
    if link.attributes:
        encoded["attributes"] = _attributes(link.attributes)
    if link.dropped_attributes:
        encoded["droppedAttributesCount"] = link.dropped_attributes
    return encoded


def _attributes(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attributes.items()]


def _value(value: Any) -> dict[str, Any]:
    # bool before int (a bool is an int), str and bytes before Sequence (both are sequences).
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_value(item) for item in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": [{"key": str(key), "value": _value(item)} for key, item in value.items()]}}
    return {}


def records_json(records: Sequence[SpanRecord]) -> bytes:
    """A request's spans in OTLP/JSON, comma-separated: what `encode` puts in its scope's list.
    What its spans share (the trace id, the caller's trace state, their parent) is written once."""
    if not records:
        return b""
    trace = records[0].trace
    head = b'{"traceId":"%032x","spanId":"' % trace.trace_id
    tail = (b',"traceState":' + orjson.dumps(trace.trace_state) if trace.trace_state else b"") + b"}"
    under_server = b',"parentSpanId":"%016x"' % trace.server_id
    return b",".join([_record(record, head, tail, under_server) for record in records])


def _record(record: SpanRecord, head: bytes, tail: bytes, under_server: bytes) -> bytes:
    """One record, written as bytes: the attribute pairs seen before are reused as they were
    encoded, the rest encoded by orjson (which escapes every text)."""
    trace = record.trace
    if record.attributes:
        reused = _REUSED.get
        try:
            attributes = b",".join([reused(pair) or _pair(*pair) for pair in record.attributes.items()])
        except TypeError:  # a value that cannot be a key (a list), or text that is not UTF-8: one by one
            attributes = b",".join([_lone_pair(key, value) for key, value in record.attributes.items()])
    else:
        attributes = b""
    parent_id = record.parent_id
    if parent_id == trace.server_id:
        parent, flags = under_server, _HAS_IS_REMOTE
    elif parent_id:
        remote = parent_id == trace.parent_id  # the caller's span
        parent, flags = (
            b',"parentSpanId":"%016x"' % parent_id,
            _HAS_IS_REMOTE | _IS_REMOTE if remote else _HAS_IS_REMOTE,
        )
    else:
        parent, flags = b"", _HAS_IS_REMOTE
    name = _NAMES.get(record.name) or _name(record.name)
    if record.message:  # (only a failed span has one)
        status = orjson.dumps({"code": record.status, "message": _utf8(record.message)})
    else:
        status = _STATUS[record.status]
    events = b""
    if record.events:
        events = b',"events":' + orjson.dumps(
            [
                {"timeUnixNano": str(at), "name": event, "attributes": _attributes(_utf8_values(said))}
                for at, event, said in record.events
            ]
        )
    return (
        head
        + (
            b'%016x","name":%s,"kind":%d,"startTimeUnixNano":"%d","endTimeUnixNano":"%d","flags":%d,"attributes":[%s],"status":%s%s%s'
            % (
                record.span_id,
                name,
                record.kind,
                record.start_ns,
                record.end_ns,
                flags,
                attributes,
                status,
                parent,
                events,
            )
        )
        + tail
    )


_STATUS = {0: b"{}", 1: b'{"code":1}', 2: b'{"code":2}'}
_REUSED: dict[tuple[str, object], bytes] = {}
_NAMES: dict[str, bytes] = {}


def _name(name: str) -> bytes:
    encoded = orjson.dumps(name)
    if len(_NAMES) < _REUSED_MAX:  # the gateway's step names: a route's, a hook's, a channel's attempt
        _NAMES[name] = encoded
    return encoded


def _pair(key: str, value: Any) -> bytes:
    """An attribute encoded; a short text kept for the next span that has it (a route, a model,
    a channel). Only text: a number would be found for the flag or the float equal to it, a
    long text is a client's (a Host header), not worth the memory, and an id is one request's.
    A number or a flag (a status, a count, a duration: new on most spans) is written around
    its key's encoding, without the dicts `_value` makes."""
    kind = type(value)
    prefix = _KEYS.get(key) or _key(key)
    if kind is str:
        encoded = prefix + b'{"stringValue":' + orjson.dumps(value) + b"}}"
        if len(value) <= _REUSED_LONGEST and key not in _ONE_REQUESTS:
            if len(_REUSED) >= _REUSED_MAX:
                _REUSED.clear()
            _REUSED[(key, value)] = encoded
        return encoded
    if kind is int:
        return prefix + b'{"intValue":"%d"}}' % value
    if kind is bool:
        return prefix + (b'{"boolValue":true}}' if value else b'{"boolValue":false}}')
    if kind is float:
        return prefix + b'{"doubleValue":' + orjson.dumps(value) + b"}}"
    return orjson.dumps({"key": key, "value": _value(value)})


# Attributes whose every value is one request's: never worth keeping encoded.
_ONE_REQUESTS = frozenset({"modelgate.request_id", "gen_ai.response.id"})
_KEYS: dict[str, bytes] = {}  # an attribute's key encoded, as a pair starts: b'{"key":"...","value":'


def _key(key: str) -> bytes:
    encoded = b'{"key":' + orjson.dumps(key) + b',"value":'
    if len(_KEYS) < _REUSED_MAX:  # the gateway's keys, and a plugin's: a handful
        _KEYS[key] = encoded
    return encoded


def _utf8_values(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: _utf8(value) if type(value) is str else value for key, value in attributes.items()}


def _utf8(text: str) -> str:
    """Text as UTF-8 can carry it: what it cannot (a client's bytes as aiohttp decoded them) replaced."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _lone_pair(key: str, value: Any) -> bytes:
    """An attribute encoded without reuse; text that holds what UTF-8 cannot (a header's bytes
    as aiohttp decoded them) with those replaced."""
    return orjson.dumps({"key": key, "value": _value(_utf8(value) if type(value) is str else value)})


def readable(record: SpanRecord, resource: Resource) -> ReadableSpan:
    """A record as the SDK's exporters take it (the console's, a test's, the protobuf encoder)."""
    trace = record.trace
    flags = TraceFlags(TraceFlags.SAMPLED if trace.sampled else TraceFlags.DEFAULT)
    state = TraceState.from_header([trace.trace_state]) if trace.trace_state else None
    parent = None
    if record.parent_id:
        remote = record.parent_id == trace.parent_id
        parent = SpanContext(trace.trace_id, record.parent_id, remote, flags, state if remote else None)
    return ReadableSpan(
        name=record.name,
        context=SpanContext(trace.trace_id, record.span_id, False, flags, state),
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        events=[Event(name, attributes, at) for at, name, attributes in record.events or ()],
        kind=_SDK_KIND[record.kind],
        instrumentation_scope=InstrumentationScope(*SCOPE),
        status=Status(StatusCode(record.status), record.message or None)
        if record.status == 2
        else Status(StatusCode(record.status)),
        start_time=record.start_ns,
        end_time=record.end_ns,
    )


def encode_protobuf(
    spans: Sequence[ReadableSpan], own: Sequence[SpanRecord] = (), resource: Resource | None = None
) -> bytes:
    """The same ExportTraceServiceRequest in protobuf, for collectors that take no JSON."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    converted = [readable(record, resource) for record in own] if own and resource is not None else []
    return encode_spans([*converted, *spans]).SerializeToString()
