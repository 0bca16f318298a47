"""`Forwarder`: sends an exchange to its channel, and alone decides whether a failed attempt goes again.

The pool sends each request once and says how far it got; what follows from each kind of
failure is one table, `FAILURES`: the client's status when no other attempt is made, whether
the channel's breaker counts it, and when a resend is safe. By default a request goes again
(to another channel, never back to one tried) only when it provably never reached an upstream;
GET requests, and chat routes that opt in with `routes.<route>.failover_unanswered`, also when
the upstream took it and closed or went quiet before a byte of answer (it may have billed).
On a keyed route an upstream's 401 refuses the channel's credential, never the client's key
(which never travels upstream): it is the gateway's fault, answered as a 502 of its own, and it
opens the channel's breaker at once, since every request there would meet it. A 403 there is
about this request (a model, a region, a resource the gateway's upstream account may not use):
it says nothing of the channel's health, so it neither opens the breaker nor counts toward it;
the request may go to another channel (another account may be permitted), and with none left
its client gets a 502 of the gateway's own, `upstream_forbidden`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from proxy.core.drain import Drain
from proxy.core.exchange import Exchange
from proxy.core.phase import phase
from proxy.core.pipeline import Pipeline
from proxy.core.runtime import Runtime
from proxy.formats import ACCOUNT, Format
from proxy.formats.translation import Untranslatable
from proxy.observability.metrics import CREDENTIAL_REFUSED, REQUEST_FORBIDDEN
from proxy.observability.tracing import attempt_traced
from proxy.policy.channels import Channel
from proxy.request.affinity import Affinity
from proxy.request.body import MultipartBody
from proxy.request.relay import Relay
from proxy.request.translating import carries, translated_request, untranslatable
from proxy.upstream import (
    BadAnswer,
    ConnectFailed,
    ConnectionLost,
    ConnectTimeout,
    InvalidRequest,
    PoolExhausted,
    RequestBodyFailed,
    UpstreamError,
    UpstreamTimeout,
    Written,
)
from proxy.wire.routes import CHAT_ROUTES, ModelFrom, Pin, Route

UpstreamModel = Callable[[Channel, Route, str], str]  # a model's name at a channel (ChannelSet.upstream_model)
_IDEMPOTENT = frozenset({"GET", "HEAD"})
# On a keyed route, the upstream's refusals: a 401 of the credential itself, a 403 of this request.
_REFUSALS = {401: CREDENTIAL_REFUSED, 403: REQUEST_FORBIDDEN}

log = logging.getLogger("modelgate.forwarder")


class Resend(Enum):
    NEVER_REACHED = "never reached"  # nothing was written: any request may go again
    UNANSWERED = "unanswered"  # written, no byte of answer: GETs, and chat routes that opt in
    IDEMPOTENT = "idempotent"  # a broken answer: GETs only
    ERROR_ANSWER = "error answer"  # the upstream answered with an error: not a submission or webhook
    # The upstream refused the request before doing any work (the channel's credential, or this
    # request's permission there): nothing ran, nothing was billed, so any request may go to
    # another channel, a video submission too.
    REFUSED = "refused"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Failure:
    status: int | None  # the client's status when no other attempt is made (None: the answer is relayed)
    breaker: bool  # counts as a failure of the channel
    resend: Resend
    code: str  # the machine code of the client's error
    says: str  # how the client's message puts it
    opens: bool = False  # opens the channel's breaker at once: every request there would fail alike


FAILURES: dict[str, Failure] = {
    "connect": Failure(502, True, Resend.NEVER_REACHED, "upstream_unreachable", "could not be reached"),
    "connect_timeout": Failure(504, True, Resend.NEVER_REACHED, "upstream_connect_timeout", "timed out connecting"),
    "pool_exhausted": Failure(
        503, False, Resend.NEVER_REACHED, "upstream_pool_exhausted", "has all the connections its pool may open busy"
    ),
    "unanswered": Failure(
        502,
        True,
        Resend.UNANSWERED,
        "upstream_unanswered",
        "took the request and closed the connection without answering",
    ),
    "first_byte_timeout": Failure(
        504, True, Resend.UNANSWERED, "upstream_timeout", "took the request and did not answer in time"
    ),
    "head_timeout": Failure(
        504, True, Resend.IDEMPOTENT, "upstream_timeout", "did not finish its answer's head in time"
    ),
    "bad_answer": Failure(
        502, True, Resend.IDEMPOTENT, "upstream_bad_answer", "sent an answer the gateway will not relay"
    ),
    "connection": Failure(502, True, Resend.IDEMPOTENT, "upstream_broke_off", "broke off its answer"),
    "status_5xx": Failure(None, True, Resend.ERROR_ANSWER, "", "answered with a server error"),
    "status_429": Failure(None, False, Resend.ERROR_ANSWER, "", "answered 429"),
    # A 401 on a keyed route: relayed, it told the client its own key was bad. Its body is the
    # upstream's words about the gateway's credential: never relayed. Wrong for every request
    # alike, so it opens the breaker at once.
    CREDENTIAL_REFUSED: Failure(
        502,
        True,
        Resend.REFUSED,
        "upstream_auth_failed",
        "refused the gateway's own credential (the gateway's configuration is at fault, not this request's key)",
        opens=True,
    ),
    # A 403 on a keyed route: the credential was taken, this request was not (Anthropic's
    # `permission_error` for a model the account may not use, a region, a resource not the
    # account's). Not the channel's health: counting it would let requests for one such model
    # open every channel's breaker and take the gateway down for every tenant. Not relayed
    # either: relayed, an SDK tells the client its own key lacks the permission, and the body
    # speaks of the gateway's upstream account (its organisation, project, tier), which
    # redacting the credential does not hide.
    REQUEST_FORBIDDEN: Failure(
        502,
        False,
        Resend.REFUSED,
        "upstream_forbidden",
        "refused this request: the gateway's account there may not use this model, "
        "region or resource (not this request's key)",
    ),
}


def status_kind(ex: Exchange, status: int) -> str | None:
    """The table's name for an upstream answer's status, or None for an answer that is no failure."""
    if status >= 500:
        return "status_5xx"
    if status == 429:
        return "status_429"
    if status in _REFUSALS and ex.route.takes_key:  # the account routes carry the client's own
        return _REFUSALS[status]
    return None


def failure_kind(exc: UpstreamError) -> str:
    """The table's name for a transport failure."""
    if isinstance(exc, PoolExhausted):
        return "pool_exhausted"
    if isinstance(exc, ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, ConnectFailed):
        return "connect"
    if isinstance(exc, BadAnswer):
        return "bad_answer"
    if isinstance(exc, UpstreamTimeout):
        return "head_timeout" if exc.answered else "first_byte_timeout"
    if not exc.answered and isinstance(exc, ConnectionLost):
        return "unanswered"
    return "connection"


class Forwarder:
    """Runs an exchange's attempts: one per channel, until one answers or none may be tried."""

    __slots__ = ("affinity", "drain")

    def __init__(self, affinity: Affinity, drain: Drain | None = None) -> None:
        self.affinity = affinity
        self.drain = drain

    async def forward(self, ex: Exchange, runtime: Runtime, pipeline: Pipeline) -> web.StreamResponse:
        """Send the request to its channel; before the client has a byte, a failure may move it
        to another channel (never back to one already tried), with a growing pause."""
        id_header = runtime.config.server.request_id_header
        tried: list[Channel] = []
        delay = runtime.config.resilience.backoff_s
        body, body_changed = ex.body, ex.body_changed  # before any channel's rename
        sent = ex.headers  # the client's, as the plugins left them: a translated attempt builds its own
        # The first channel that could not take the request: what it refused, its format, itself, the model there.
        refused: tuple[Untranslatable, Format, Channel, str | None] | None = None
        while True:
            channel = ex.channel
            assert channel is not None and channel.pool is not None
            tried.append(channel)
            upstream_format = channel.translated_format(ex.route)
            if upstream_format is not None:
                made = await translated_request(ex, runtime, pipeline, channel, upstream_format, sent)
                if isinstance(made, Untranslatable):
                    # Nothing was sent: a channel of another format may carry what this one cannot.
                    refused = refused or (made, upstream_format, channel, ex.upstream_model)
                    following = runtime.channels.pick(ex.route, ex.model, exclude=tuple(tried))
                    if following is None:
                        made, upstream_format, ex.channel, ex.upstream_model = refused  # the refusal told
                        return untranslatable(ex, made, upstream_format)
                    ex.channel = following
                    ex.restore_body(body, body_changed)
                    continue
                target, data = made
                path = target.partition("?")[0]
            else:
                ex.translation, ex.headers = None, sent
                path = self._path_for(ex, channel, runtime.channels.upstream_model)
                if path is None:
                    return ex.error_response(
                        400,
                        "model: the form's model field must come before its files, so the gateway can name the "
                        "model as this channel knows it",
                        param="model",
                    )
                path = ex.format.versioned_path(path, channel.config.content_api_version)
                if pipeline.upstream_hooks:
                    await pipeline.run_upstream(ex)
                target, data = self._request_for(ex, channel, path)
            with phase(ex, f"{ex.request.method} upstream {channel.name}", "client") as span:
                attempt_traced(ex, span, channel.name, channel.pool.host, path, len(tried))
                result: web.StreamResponse | tuple[Channel, str] | None = None
                try:
                    result = await self._attempt(ex, runtime, pipeline, channel, target, data, id_header, tried)
                finally:
                    if span is not None:  # the upstream's status; with no head, the answer the gateway made
                        answered = result.status if isinstance(result, web.StreamResponse) else 0
                        span.set_attribute("http.response.status_code", ex.outcome.upstream_status or answered)
            if isinstance(result, web.StreamResponse):
                return result
            assert result is not None
            ex.channel, reason = result
            paused = time.perf_counter()
            ex.outcome.attempt_ended(paused)
            runtime.observer.retried(ex, reason)
            try:  # the pause is its own part of the request's time, neither the gateway's nor an upstream's
                await asyncio.sleep(delay)
            finally:
                ex.outcome.paused(time.perf_counter() - paused)
            delay *= 2
            ex.restore_body(body, body_changed)

    async def _attempt(
        self,
        ex: Exchange,
        runtime: Runtime,
        pipeline: Pipeline,
        channel: Channel,
        target: str,
        data: bytes | AsyncIterator[bytes] | None,
        id_header: str,
        tried: list[Channel],
    ) -> web.StreamResponse | tuple[Channel, str]:
        """One attempt: the client's answer, or the next channel to try and why."""
        observer = runtime.observer
        assert channel.pool is not None
        ex.outcome.attempt_started(time.perf_counter())
        try:
            upstream = await channel.pool.request(
                ex.request.method, target, ex.headers, data, waited=ex.outcome.pool_waited
            )
        except UpstreamError as exc:
            if isinstance(data, MultipartBody) and data.rejection is not None:
                violation = data.rejection  # the body broke a rule while it streamed: the upstream got no whole request
                # The same body would be refused again: the official SDKs must not send it on their own.
                return ex.error_response(
                    violation.status,
                    str(violation),
                    violation.code,
                    headers={"x-should-retry": "false"},
                    param=violation.path or None,
                )
            if isinstance(exc, RequestBodyFailed):  # the client's body failed: not the channel's fault
                return ex.error_response(400, "the request body could not be read to its end")
            if isinstance(exc, InvalidRequest):
                return ex.error_response(502, f"the request for upstream {channel.name} could not be written: {exc}")
            kind = failure_kind(exc)
            if kind != "pool_exhausted":  # a full pool is the gateway's own limit: no fault of the channel's
                channel.health.record(FAILURES[kind].breaker)
            observer.upstream_result(channel, kind)
            if (following := self._next_channel(ex, runtime, tried, kind, exc.written)) is not None:
                return following
            return self._failed(ex, channel.name, kind, exc)
        status = upstream.status
        ex.outcome.headers_arrived(time.perf_counter(), status)
        kind = status_kind(ex, status)
        failure = FAILURES[kind] if kind is not None else None
        channel.health.record(failure is not None and failure.breaker, at_once=failure is not None and failure.opens)
        observer.upstream_result(channel, kind)
        if kind is not None and failure is not None:
            if failure.opens:  # said at error, whether or not another channel serves the request
                log.error(
                    "upstream refused the channel's credential; its breaker is open",
                    extra={
                        "channel": channel.name,
                        "status": status,
                        "route": ex.route.name,
                        "request_id": ex.request_id,
                    },
                )
            if kind != "status_429" or runtime.config.resilience.failover_on_429:
                if (following := self._next_channel(ex, runtime, tried, kind, Written.ALL)) is not None:
                    upstream.close()
                    return following
            if failure.status is not None:  # the gateway's own answer, not the upstream's
                upstream.close()
                return ex.error_response(
                    failure.status,
                    f"upstream {channel.name} answered {status}: it {failure.says}",
                    failure.code,
                    headers={"x-should-retry": "false"},
                )
        try:
            relay = Relay(
                ex,
                upstream,
                pipeline,
                self.affinity,
                buffer_limit=int(runtime.config.server.max_json_body_mb * 1024 * 1024),
                max_event=int(runtime.config.server.max_stream_event_mb * 1024 * 1024),
                request_id_header=id_header,
                observer=observer,
                client_idle_s=runtime.config.server.client_idle_s,
                drain=self.drain,
            )
            return await relay.send()
        finally:
            upstream.release()

    @staticmethod
    def _failed(ex: Exchange, channel: str, kind: str, exc: UpstreamError) -> web.Response:
        """The client's error for a failed attempt that goes no further. `x-should-retry` tells
        the official SDKs, which would otherwise send a 5xx again on their own, whether that is
        safe: only when the upstream never got the request."""
        failure = FAILURES[kind]
        status = failure.status or 502
        if status == 502 and ex.route.format is ACCOUNT:
            status = 503  # a webhook's sender, a login form, retry a 503
        never_reached = exc.written is Written.NOTHING
        headers = {"x-should-retry": "true" if never_reached else "false"}
        if kind == "pool_exhausted":
            headers["Retry-After"] = "1"
        reused = " on a reused connection" if exc.reused and not exc.answered and not never_reached else ""
        return ex.error_response(status, f"upstream {channel} {failure.says}{reused}", failure.code, headers=headers)

    @staticmethod
    def may_resend(ex: Exchange, runtime: Runtime, kind: str, written: Written) -> bool:
        """Whether a request that failed this way may be sent again at all (to another channel)."""
        rule = FAILURES[kind].resend
        if ex.pinned_channel is not None:
            return False  # the id lives on that channel alone
        if ex.body_stream is not None:
            return False  # a streamed body cannot be read twice
        idempotent = ex.request.method in _IDEMPOTENT
        if rule is Resend.NEVER_REACHED or written is Written.NOTHING:
            return True
        if rule is Resend.UNANSWERED:
            return idempotent or (ex.route.name in CHAT_ROUTES and runtime.routes[ex.route.name].failover_unanswered)
        if rule is Resend.IDEMPOTENT:
            return idempotent
        if rule is Resend.ERROR_ANSWER:
            return ex.route.creates is not Pin.VIDEO_TASK and ex.route.format is not ACCOUNT
        return rule is Resend.REFUSED

    def _next_channel(
        self, ex: Exchange, runtime: Runtime, tried: list[Channel], kind: str, written: Written
    ) -> tuple[Channel, str] | None:
        """The next channel to try, if this request may be sent again and one is left."""
        if len(tried) >= runtime.config.resilience.max_attempts or not self.may_resend(ex, runtime, kind, written):
            return None
        passed = list(tried)
        while (following := runtime.channels.pick(ex.route, ex.model, exclude=tuple(passed))) is not None:
            if carries(ex, following):
                return following, kind
            passed.append(following)  # its format cannot carry this request: this failure is the client's answer
        return None

    # -- the request for one channel --

    def _path_for(self, ex: Exchange, channel: Channel, upstream_model: UpstreamModel) -> str | None:
        """The upstream path, built from the route's template, with the model renamed (in the path
        or the body) where the channel knows it by another name; before the on_upstream hooks, so
        they see the channel's name. None when a form's model cannot be renamed (it came late)."""
        assert ex.target is not None
        if ex.followed is not None and ex.followed.upstream_id is not None:
            return ex.target.path(task_id=ex.followed.upstream_id)  # the client holds an alias of it
        if ex.model is None:
            return ex.target.path()
        ex.upstream_model = upstream_model(channel, ex.route, ex.model)
        if ex.route.model_from is ModelFrom.PATH:
            return ex.target.path(model=ex.upstream_model)
        if ex.upstream_model != ex.model and not self._rename_in_body(ex):
            return None
        return ex.target.path()

    @staticmethod
    def _request_for(ex: Exchange, channel: Channel, path: str) -> tuple[str, bytes | AsyncIterator[bytes] | None]:
        """The request target and body for this channel; its credential goes into the headers."""
        headers = ex.headers
        ex.format.place_credential(channel.credential, headers)
        ex.format.place_version(headers, channel.config.version_header, ex.request.headers)
        data: bytes | AsyncIterator[bytes] | None = ex.body
        if ex.body_stream is not None:
            data = ex.body_stream
            if isinstance(data, MultipartBody) and data.declared_length is not None:
                headers["Content-Length"] = str(data.declared_length)
        assert ex.target is not None
        query = ex.target.query_string(ex.format.credential_query(channel.credential))
        return (f"{path}?{query}" if query else path), data

    @staticmethod
    def _rename_in_body(ex: Exchange) -> bool:
        old, new = ex.model or "", ex.upstream_model or ""
        if isinstance(ex.body_stream, MultipartBody):
            return ex.body_stream.rename_model(old, new)
        body = ex.json()
        if isinstance(body, dict):
            ex.set_json({**body, "model": new})
        return True
