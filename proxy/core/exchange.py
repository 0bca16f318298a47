"""`Exchange`: everything about one request as it passes through the gateway.

Each part has one owner. What the client sent (route, target, path parameters, model, stream
flag, body as read) is set by the gateway and proxy/request/body.py before the pipeline runs.
The request to forward (upstream headers, body) starts as the client's and is shaped by
plugins; the caller (`key`) is set by the plugin that provides it; the pipeline it runs on by
the gateway and proxy/core/pipeline.py; the routing decision (`channel`, `upstream_model`, the
followed id's record) by the gateway, the forwarder and proxy/request/affinity.py; what each
plugin keeps for the request, in its own room (`state`). `outcome` (proxy/core/outcome.py) is
changed only through its methods. The body is parsed at most once, and only when something
asks; bytes nobody changed are forwarded as the client sent them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.core import jsonutil
from proxy.core.outcome import Outcome
from proxy.core.usage import Generation, Usage

if TYPE_CHECKING:
    import asyncio

    from proxy.core.pin import PinRecord
    from proxy.core.pipeline import Pipeline
    from proxy.formats import Format
    from proxy.formats.translation import Translation
    from proxy.policy.channels import Channel
    from proxy.policy.keys import GatewayKey
    from proxy.request.target import Target
    from proxy.state import Write
    from proxy.wire.multipart import MultipartObserver
    from proxy.wire.routes import Route

_UNPARSED = object()


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
        "_states",
        "tracer",
        "span",
        "trace",
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
        "translation",
        "assumed_output",
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
        self._states: dict[int, dict[str, Any]] | None = None  # each plugin's own (`state`)
        # The pipeline this exchange runs on: its route's, set by the gateway, or a narrower one
        # once a plugin does not take it (Pipeline.run_request). Set by those two only.
        self.pipeline: Pipeline | None = None
        # The attempt's request and answer in another format than the client's (set by the
        # forwarder for a channel of another format; None: passed through as the client's).
        self.translation: Translation | None = None
        # The output a request naming no limit was charged for (proxy/request/charges.py); a
        # translation that must write a limit the client did not name writes this one.
        self.assumed_output: int | None = None
        self.response_headers: dict[str, str] | None = None  # plugins' additions to the client's answer
        self.answer_limit: AnswerLimit | None = None  # a plugin must read the whole answer
        # Set by the observability layer when tracing is on: the request's trace ids and head
        # decision (`trace`, always), and, when its spans are recorded, what records them (a
        # PhaseTracer) and its server span, which `phase` makes children of.
        self.trace: Any = None
        self.tracer: Any = None
        self.span: Any = None

    def state(self, plugin: object) -> dict[str, Any]:
        """What `plugin` keeps for this request between its hooks, in a room no other plugin
        reads or writes (made on first use)."""
        states = self._states
        if states is None:
            states = self._states = {}
        room = states.get(id(plugin))  # by identity: a plugin need not be hashable
        if room is None:
            room = states[id(plugin)] = {}
        return room

    def json(self) -> Any:
        """The request body as JSON (parsed on first use); None for a body that is not JSON."""
        if self._json is _UNPARSED:
            self._json = jsonutil.parsed(self.body)
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

    def error_response(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> web.Response:
        """An error in this endpoint's own shape (section 7 of the spec)."""
        self.outcome.failed(message, code)
        return self.format.error_response(status, message, code, headers, param)

    @property
    def upstream_format(self) -> str | None:
        """The format the (last) upstream attempt was asked in: the client's, unless translated;
        None when no upstream was asked (none chosen, or the request refused before it went)."""
        if self.translation is not None:
            return self.translation.upstream_format
        return self.format.name if self.channel is not None and self.outcome.attempts else None

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
