"""The gateway's own spans: slotted records with ids and times, encoded only when exported.

An OpenTelemetry SDK span costs about 40 us to start and end here (its lock, its attribute
checks, its sampler call, its processor chain); a request's eight spans made tracing cost twice
the request itself. The spans the gateway makes on every request (its server span, each working
plugin hook, each upstream attempt, the stream) are these records instead: about 2 us each. They
carry what OTLP needs and nothing else, and a request's are handed over together when it ends.
The SDK still makes what third-party code starts through the OpenTelemetry API: those become
children of the request's server span (`OtelParent`, the current span while a request runs).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

# OTLP's numbers for span kinds and status codes.
INTERNAL, SERVER, CLIENT = 1, 2, 3
UNSET, OK, ERROR = 0, 1, 2
KINDS = {"internal": INTERNAL, "client": CLIENT}

_getrandbits = random.getrandbits
_time_ns = time.time_ns


def new_span_id() -> int:
    return _getrandbits(64) or 1  # 0 is no span, in W3C's and OTLP's terms


def new_trace_id() -> int:
    return _getrandbits(128) or 1


@dataclass(slots=True, eq=False)
class RequestTrace:
    """One request's part of a trace: its ids, the head decision, and its spans once ended."""

    trace_id: int
    sampled: bool  # the head decision: its traceparent goes upstream with this flag
    parent_id: int = 0  # the caller's span (a remote parent), 0 when the trace starts here
    trace_state: str = ""  # the caller's tracestate, passed on as it came
    server_id: int = field(default_factory=new_span_id)
    finished: list[SpanRecord] = field(default_factory=list)
    token: Any = None  # the OpenTelemetry context attached while the request runs
    link: str | None = None  # its page in the trace viewer, once exported (tracing.viewer_url)

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{'01' if self.sampled else '00'}"


class SpanRecord:
    """One span: what OTLP carries of it. Ended by leaving its `with` block (or `end()`); a block
    left by an exception records it and marks the span failed, except a cancellation (the client
    left, a drain stopped the request: no fault of the step's), which is marked as such."""

    __slots__ = (
        "trace",
        "name",
        "kind",
        "span_id",
        "parent_id",
        "start_ns",
        "end_ns",
        "attributes",
        "status",
        "message",
        "events",
    )

    def __init__(
        self,
        trace: RequestTrace,
        name: str,
        kind: int,
        span_id: int,
        parent_id: int,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self.trace = trace
        self.name = name
        self.kind = kind
        self.span_id = span_id
        self.parent_id = parent_id
        self.start_ns = _time_ns()
        self.end_ns = 0
        self.attributes: dict[str, Any] = {} if attributes is None else attributes
        self.status = UNSET
        self.message = ""
        self.events: list[tuple[int, str, dict[str, Any]]] | None = None

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if isinstance(status, Status):
            status, description = status.status_code, status.description
        self.status = status.value
        self.message = description or "" if status is StatusCode.ERROR else ""

    def add_event(self, name: str, attributes: dict[str, Any] | None = None, timestamp: int | None = None) -> None:
        if self.events is None:
            self.events = []
        self.events.append((timestamp or _time_ns(), name, dict(attributes or {})))

    def record_exception(self, exc: BaseException) -> None:
        self.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.message": str(exc)[:1000]})

    def is_recording(self) -> bool:
        return True

    def end(self) -> None:
        if not self.end_ns:
            self.end_ns = _time_ns()
            self.trace.finished.append(self)

    def child(self, name: str, kind: int = INTERNAL, attributes: dict[str, Any] | None = None) -> SpanRecord:
        return SpanRecord(self.trace, name, kind, _getrandbits(64) or 1, self.span_id, attributes)

    def span_context(self) -> SpanContext:
        flags = TraceFlags(TraceFlags.SAMPLED if self.trace.sampled else TraceFlags.DEFAULT)
        return SpanContext(self.trace.trace_id, self.span_id, is_remote=False, trace_flags=flags)

    def __enter__(self) -> SpanRecord:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: object) -> None:
        if exc is not None:
            if isinstance(exc, asyncio.CancelledError):
                self.attributes["modelgate.cancelled"] = True
            elif isinstance(exc, Exception):
                self.record_exception(exc)
                self.status, self.message = ERROR, type(exc).__name__
        self.end()


class OtelParent(trace.Span):
    """A record as the OpenTelemetry API sees it: a parent for spans third-party code starts.
    Its context is made only if someone asks (most requests start no span of their own)."""

    def __init__(self, record: SpanRecord) -> None:
        self.record = record

    def get_span_context(self) -> SpanContext:
        return self.record.span_context()

    def is_recording(self) -> bool:
        return True  # what is set through this face lands on the record

    def set_attribute(self, key: str, value: Any) -> None:
        self.record.set_attribute(key, value)

    def set_attributes(self, attributes: Any) -> None:
        self.record.set_attributes(dict(attributes))

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self.record.add_event(name, attributes, timestamp)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.record.set_status(status, description)

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        self.record.record_exception(exception)

    def update_name(self, name: str) -> None:
        pass  # the gateway names its own steps

    def end(self, end_time: int | None = None) -> None:
        pass  # ended by the gateway, when its step is
