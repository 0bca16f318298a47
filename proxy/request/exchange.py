"""`Exchange`: everything about one request as it passes through the gateway, and `Outcome`,
what became of it.

Each part has one owner. What the client sent (route, target, path parameters, model, stream
flag, body as read) is set by the gateway and proxy/request/body.py before the pipeline runs.
The request to forward (upstream headers, body) starts as the client's and is shaped by
plugins; the caller (`key`) is set by the plugin that provides it; the pipeline it runs on by
the gateway and proxy/pipeline.py; the routing decision
(`channel`, `upstream_model`, the followed id's record) by the gateway, the forwarder and
proxy/request/affinity.py. `outcome` (status, bytes, timings, error) is written only by the
forwarder and the relay, and by the gateway for the answers it makes itself; everything after
reads it. (An error answer made with `error_response`, a plugin's too, records its message
there: the message is what that answer says.) The body is parsed at most once, and only when
something asks; bytes nobody changed are forwarded as the client sent them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.formats import Format, Generation, Usage
from proxy.policy.keys import GatewayKey
from proxy.request.headers import content_codings
from proxy.wire import jsonutil
from proxy.wire.multipart import MultipartObserver
from proxy.wire.routes import Route

if TYPE_CHECKING:
    import asyncio

    from proxy.pipeline import Pipeline
    from proxy.policy.channels import Channel
    from proxy.request.affinity import PinRecord
    from proxy.request.target import Target
    from proxy.state import Write

_UNPARSED = object()
DECODED_LIMIT = 64 * 1024 * 1024  # the most of a decoded answer body the gateway will hold


class Exchange:
    """One client request, its upstream attempt and its outcome."""

    __slots__ = (
        "request",
        "route",
        "format",
        "request_id",
        "started",
        "client_ip",
        "headers",
        "path_params",
        "body",
        "body_stream",
        "multipart",
        "_json",
        "body_changed",
        "model",
        "upstream_model",
        "channel",
        "pinned_channel",
        "key",
        "streaming",
        "usage",
        "generation",
        "outcome",
        "plugin_state",
        "tracer",
        "span",
        "unsampled_span",
        "response_headers",
        "answer_limit",
        "gateway_id",
        "target",
        "followed_id",
        "follow_lookup",
        "followed",
        "created_id",
        "with_pin",
        "pinned_with",
        "pipeline",
    )

    def __init__(self, request: web.Request, route: Route, request_id: str, gateway_id: str | None = None) -> None:
        self.request = request
        self.route = route
        self.format: Format = route.format
        self.request_id = request_id  # for correlation: the caller's own, when it sent a usable one
        self.gateway_id = gateway_id or request_id  # always the gateway's: what limits and leases count by
        self.started = time.perf_counter()
        self.client_ip: str = request.remote or ""
        self.headers: CIMultiDict[str] = CIMultiDict()  # what goes upstream; set before on_request
        self.path_params: dict[str, str] = dict(request.match_info)
        self.body: bytes | None = None
        self.body_stream: AsyncIterator[bytes] | None = None
        self.multipart: MultipartObserver | None = None
        self._json: Any = _UNPARSED
        self.body_changed = False
        self.model: str | None = None
        self.upstream_model: str | None = None
        self.channel: Channel | None = None
        self.pinned_channel: str | None = None
        self.key: GatewayKey | None = None  # the caller: set by the plugin that provides it (auth)
        self.target: Target | None = None  # the checked request target (set before the body is read)
        self.followed_id: str | None = None  # the id this request follows (a task, a previous response)
        # The lookup of its record, under way; the record is set on `followed` only once the core
        # has checked that it is the caller's tenant's (None: never handed out, or not yet checked).
        self.follow_lookup: asyncio.Task[PinRecord | None] | None = None
        self.followed: PinRecord | None = None
        self.created_id: str | None = None  # the id the answer hands out (set by the affinity, after the hooks)
        # Writes a plugin wants made with the pin of the id the answer hands out, in the same step
        # and only if that pin is taken for the id as the upstream gave it; `pinned_with`: they were.
        self.with_pin: list[Write] = []
        self.pinned_with = False
        self.streaming = route.always_streams  # the client asked for a stream
        self.usage = Usage()  # as the upstream reported it (read by the usage plugins)
        # What the answer tells of a generation that may outlive it, the one it made or the one it
        # follows (a background response, a video task): set by the plugins that read answers.
        self.generation: Generation | None = None
        self.outcome = Outcome()
        self.plugin_state: dict[str, Any] = {}
        # The pipeline this exchange runs on: its route's, set by the gateway, or a narrower one
        # once a plugin does not take it (Pipeline.run_request). Set by those two only.
        self.pipeline: Pipeline | None = None
        self.response_headers: dict[str, str] | None = None  # plugins' additions to the client's answer
        self.answer_limit: AnswerLimit | None = None  # a plugin must read the whole answer
        self.tracer: Any = None  # the OpenTelemetry tracer, when this request is traced
        self.span: Any = None  # its server span
        self.unsampled_span: Any = None  # a request traced but not sampled: its ids travel on, nothing is recorded

    def json(self) -> Any:
        """The request body as JSON (parsed on first use); None for a body that is not JSON."""
        if self._json is _UNPARSED:
            self._json = _parsed(self.body)
        return self._json

    def asked(self) -> Any:
        """What the request asks, field by field: its JSON body, or a form's text fields read so far."""
        if self.multipart is not None:
            return self.multipart.fields()
        return self.json()

    def set_json(self, value: Any) -> None:
        """Replace the body: it is encoded again and forwarded in place of the client's bytes.
        BodyTooDeep when the encoder cannot (JSON nested past its 254 levels, which the parser took)."""
        try:
            body = jsonutil.dumps(value)
        except jsonutil.JSONEncodeError as exc:
            raise BodyTooDeep(str(exc)) from None
        self._json = value
        self.body = body
        self.body_changed = True

    def restore_body(self, body: bytes | None, changed: bool) -> None:
        """Put back a body as it was (before another channel's rename, say)."""
        if body is not self.body:
            self.body, self._json = body, _UNPARSED
        self.body_changed = changed

    def answer_locally(self, response: web.StreamResponse, id_header: str) -> web.StreamResponse:
        """An answer the gateway makes itself (an error, a plugin's answer), with the headers
        plugins added and the request id."""
        if self.response_headers:
            for name, value in self.response_headers.items():
                response.headers.setdefault(name, value)
        response.headers[id_header] = self.request_id
        self.outcome.status = response.status
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            self.outcome.bytes_out = len(response.body)  # what the access line says was sent
        return response

    def error_response(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> web.Response:
        """An error in this endpoint's own shape (section 7 of the spec)."""
        self.outcome.error, self.outcome.error_code = message, code
        return self.format.error_response(status, message, code, headers, param)

    @property
    def key_name(self) -> str | None:
        return self.key.name if self.key is not None else None

    @property
    def tenant(self) -> str | None:
        """Who owns what this request makes (the caller's tenant label, else its key)."""
        return self.key.tenant if self.key is not None else None

    def overhead_seconds(self, now: float | None = None) -> float:
        """Time the gateway itself spent: total so far minus time waiting on upstreams, the pauses
        between attempts and waits for a connection a channel's pool may open (an upstream outage
        is not the gateway's slowness)."""
        total = (now or time.perf_counter()) - self.started
        outcome = self.outcome
        return max(0.0, total - outcome.upstream_seconds() - outcome.backoff_s - outcome.pool_wait_s)

    def server_timing(self) -> str:
        """The `Server-Timing` value: the gateway's own time and the upstream's, and the pauses
        between attempts and pool waits, each as its own part when there was any."""
        outcome = self.outcome
        timing = (
            f'gateway;dur={self.overhead_seconds() * 1000:.3f};desc="gateway overhead", '
            f"upstream;dur={outcome.upstream_seconds() * 1000:.3f}"
        )
        if outcome.backoff_s:
            timing += f', backoff;dur={outcome.backoff_s * 1000:.3f};desc="failover backoff"'
        if outcome.pool_wait_s:
            timing += f', pool;dur={outcome.pool_wait_s * 1000:.3f};desc="waiting for an upstream connection"'
        return timing


class Outcome:
    """What became of one exchange: written by the forwarder and the relay (and the gateway, for
    an answer it makes itself or a client gone; a channel's pool tells its wait through
    `pool_waited`, which the forwarder hands it), read by the access line, metrics, traces and
    `on_complete` hooks. Its time is four parts: upstream (every attempt's), failover backoff,
    pool wait, and the rest, the gateway's own (`Exchange.overhead_seconds`)."""

    __slots__ = (
        "status",
        "streamed",
        "bytes_out",
        "events",
        "error",
        "error_code",
        "client_aborted",
        "cut_by",
        "attempts",
        "upstream_started",
        "upstream_headers_at",
        "upstream_finished",
        "upstream_before_s",
        "backoff_s",
        "pool_wait_s",
    )

    def __init__(self) -> None:
        self.status = 0
        self.streamed = False  # the answer went out as an event stream
        self.bytes_out = 0
        self.events = 0  # stream events that reached the client (streams framed event by event)
        self.error: str | None = None
        self.error_code: str | None = None  # the code of an error answer the gateway made itself
        self.client_aborted = False
        # Who ended an answer before its end, once the upstream had the request: "client" (it
        # left), "upstream" (it broke off or stalled), "gateway" (a drain, or a fault of its own).
        self.cut_by: str | None = None
        self.attempts = 0  # upstream attempts made (a failover's each, a resend's each)
        # The current (or last) attempt, from the moment a connection was had; the attempts before
        # it add their upstream time to `upstream_before_s`.
        self.upstream_started: float | None = None
        self.upstream_headers_at: float | None = None
        self.upstream_finished: float | None = None
        self.upstream_before_s = 0.0
        self.backoff_s = 0.0  # paused between attempts (resilience.backoff_s, doubling)
        self.pool_wait_s = 0.0  # waited for a connection a channel's pool may open (pool.max_connections)

    def attempt_started(self, now: float) -> None:
        """An upstream attempt begins: the ones before it keep their upstream time."""
        if self.upstream_started is not None:
            self.upstream_before_s = self.upstream_seconds()  # the last one ended (attempt_ended)
            self.upstream_headers_at = self.upstream_finished = None
        self.upstream_started = now
        self.attempts += 1

    def attempt_ended(self, now: float) -> None:
        """An attempt that goes no further (another channel is tried next): its upstream time
        ends here, not while the pause before the next one runs."""
        if self.upstream_started is not None and self.upstream_finished is None:
            self.upstream_finished = now

    def pool_waited(self, seconds: float) -> None:
        """The current attempt waited this long for a connection slot before any upstream work."""
        self.pool_wait_s += seconds
        if self.upstream_started is not None:
            self.upstream_started += seconds

    def upstream_seconds(self) -> float:
        """Time spent on upstreams, every attempt's together."""
        if self.upstream_started is None:
            return self.upstream_before_s
        end = self.upstream_finished or self.upstream_headers_at or time.perf_counter()
        return self.upstream_before_s + end - self.upstream_started


@dataclass(slots=True, frozen=True)
class AnswerLimit:
    """What a plugin that must read a whole (successful) answer asks of the relay: an answer
    larger than `size` bytes is refused, as a 502 with the plugin's own error `code`."""

    size: int
    code: str

    @property
    def message(self) -> str:
        return f"the upstream's answer is over the {self.size / (1024 * 1024):g} MB processing limit"

    def refusal(self, ex: Exchange) -> web.Response:
        return ex.error_response(502, self.message, self.code)


class BodyTooDeep(ValueError):
    """A request body the gateway must encode again and cannot: a 400, never forwarded."""


class AnswerTooLarge(Exception):
    """An upstream answer larger, once decoded, than the gateway will hold."""


class UpstreamResponse:
    """A buffered upstream answer that `on_response` hooks may read and change."""

    __slots__ = ("status", "headers", "body", "changed", "_json")

    def __init__(self, status: int, headers: CIMultiDict[str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.changed = False
        self._json: Any = _UNPARSED

    @property
    def is_json(self) -> bool:
        return "json" in self.headers.get("content-type", "")

    def decoded_body(self, limit: int = DECODED_LIMIT) -> bytes | None:
        """The body without its Content-Encoding, or None when it cannot be decoded here: an
        unknown coding, more than one (in one header or several), or bytes that do not decode.
        More than `limit` bytes once decoded (a small gzip can hide a huge body) raise AnswerTooLarge."""
        codings = content_codings(self.headers)
        if not codings:
            return self.body
        if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
            return None
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if codings[0] != "deflate" else zlib.MAX_WBITS)
        try:
            data = inflate.decompress(self.body, limit + 1)
        except zlib.error:
            return None
        if len(data) > limit:
            raise AnswerTooLarge(limit)
        return data if inflate.eof else None

    def json(self) -> Any:
        if self._json is _UNPARSED:
            try:
                self._json = _parsed(self.decoded_body() if self.is_json else None)
            except AnswerTooLarge:
                self._json = None
        return self._json

    def set_json(self, value: Any) -> None:
        self._json = value
        self.body = jsonutil.dumps(value)
        self.headers.popall("content-encoding", None)
        self.headers["Content-Type"] = "application/json"
        self.changed = True


def _parsed(raw: bytes | None) -> Any:
    """JSON from bytes; None for none, or for bytes that are not JSON."""
    if not raw:
        return None
    try:
        return jsonutil.loads(raw)
    except jsonutil.JSONDecodeError:
        return None
