"""`Gateway`: the handler every endpoint shares, taking one exchange from client to upstream and back."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator

from aiohttp import web
from multidict import CIMultiDict

from opentelemetry.trace import Span, SpanKind

from proxy.access_log import log_exchange
from proxy.affinity import Affinity, StateUnavailable
from proxy.body import BodyError, MultipartBody, read_body
from proxy.channels import Channel
from proxy.client_limits import ConnectionCount, header_problem
from proxy.deciding_fields import resolve_model, settle_json
from proxy.config.model import ServerConfig
from proxy.exchange import Exchange
from proxy.observability.tracing import Tracing, end_request, inject, start_child
from proxy.headers import add_forwarding, end_to_end
from proxy.pipeline import Pipeline
from proxy.relay import Relay
from proxy.formats import ACCOUNT
from proxy.routes import ModelFrom, Pin, Route
from proxy.runtime import Runtime
from proxy.target import TargetError, build_target
from proxy.upstream import ConnectFailed, ConnectTimeout, InvalidRequest, RequestBodyFailed, UpstreamError

log = logging.getLogger("modelgate.gateway")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Request ids: a random per-process prefix and a counter; unique across instances, and far
# cheaper than a uuid4 (an os.urandom call) per request.
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


class Gateway:
    """Holds the live Runtime and serves each request against the one current when it arrived."""

    __slots__ = ("runtime", "affinity", "tracing", "connections")

    def __init__(self, runtime: Runtime, affinity: Affinity, tracing: Tracing,
                 connections: ConnectionCount | None = None) -> None:
        self.runtime = runtime
        self.affinity = affinity
        self.tracing = tracing
        self.connections = connections or ConnectionCount()

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        runtime = self.runtime
        runtime.enter()
        config = runtime.config.server
        incoming_id = request.headers.get(config.request_id_header, "")
        gateway_id = new_request_id()
        # A caller's id is kept for correlation only; what is counted goes by the gateway's own.
        request_id = incoming_id if incoming_id and _REQUEST_ID.match(incoming_id) else gateway_id
        ex = Exchange(request, route, request_id, gateway_id)
        runtime.observer.started(ex)
        self.tracing.start_request(ex)
        response: web.StreamResponse | None = None
        try:
            response = await self._serve(ex, runtime)
            return response
        except asyncio.CancelledError:
            ex.client_aborted = True  # the client went away; aiohttp cancelled the handler
            if ex.status == 0:
                ex.status = 499  # as nginx logs a client that closed before the answer
            raise
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id, "route": route.name})
            response = ex.error_response(500, "the gateway failed to handle this request")
            return self._finish_local(ex, response, config.request_id_header)
        finally:
            if ex.status == 0 and response is not None:
                ex.status = response.status
            await runtime.pipelines[route.name].run_complete(ex)
            now = time.perf_counter()
            overhead = ex.overhead_seconds(now)  # read once: metrics, trace and access line agree
            runtime.observer.finished(ex, now, overhead)
            end_request(ex, overhead)
            log_exchange(ex, runtime.config.observability.logging, now, overhead)
            runtime.leave()

    async def _serve(self, ex: Exchange, runtime: Runtime) -> web.StreamResponse:
        server = runtime.config.server
        id_header = server.request_id_header
        refusal = self._over_client_limits(ex, server)
        if refusal is not None:
            return self._finish_local(ex, refusal, id_header)
        try:
            ex.target = build_target(ex.request.raw_path, ex.route.path, ex.path_params)
        except TargetError as exc:
            return self._finish_local(ex, ex.error_response(400, str(exc), "invalid_request_target", param=exc.param),
                                      id_header)
        try:
            await read_body(ex, *self._body_limits(ex, runtime), server.client_idle_s,
                            self._body_timeout(ex, runtime))
        except BodyError as exc:
            refusal = ex.error_response(exc.status, str(exc), param=exc.param)
            if exc.status == 408:
                refusal.force_close()  # the rest of a stalled body must not be read as the next request
            return self._finish_local(ex, refusal, id_header)
        refusal = resolve_model(ex) or settle_json(ex)
        if refusal is not None:
            return self._finish_local(ex, refusal, id_header)
        if ex.route.follows is not None:
            try:  # before the pipeline: the auth plugin decides whose the id is
                await self.affinity.follow(ex)
            except StateUnavailable:
                return self._finish_local(ex, ex.error_response(
                    503, "the gateway cannot look up this id right now; retry shortly", "state_unavailable",
                    headers={"Retry-After": "2"}), id_header)
        ex.headers = self._upstream_headers(ex, runtime, id_header)  # before the pipeline: plugins may edit them
        pipeline = runtime.pipelines[ex.route.name]
        answer = await pipeline.run_request(ex)
        if answer is not None:
            return self._finish_local(ex, answer, id_header)
        refusal = await self._choose_channel(ex, runtime)
        if refusal is not None:
            return self._finish_local(ex, refusal, id_header)
        return await self._forward(ex, runtime, pipeline)

    @staticmethod
    def _body_timeout(ex: Exchange, runtime: Runtime) -> float:
        """The longest a whole body may take to arrive: the route's own, else the server's."""
        route = runtime.config.routes.get(ex.route.name)  # type: ignore[call-overload]
        if route is not None and route.body_timeout_s is not None:
            return route.body_timeout_s
        return runtime.config.server.body_timeout_s

    @staticmethod
    def _body_limits(ex: Exchange, runtime: Runtime) -> tuple[int, int]:
        """Bytes allowed for a whole body and for a streamed upload: the route's own limit, else the server's."""
        server = runtime.config.server
        route = runtime.config.routes.get(ex.route.name)  # type: ignore[call-overload]
        if route is not None and route.max_body_mb is not None:
            limit = int(route.max_body_mb * 1024 * 1024)
            return limit, limit
        return int(server.max_json_body_mb * 1024 * 1024), int(server.max_upload_mb * 1024 * 1024)

    def _over_client_limits(self, ex: Exchange, server: ServerConfig) -> web.Response | None:
        if self.connections.open > server.max_connections:
            refusal = ex.error_response(503, f"the gateway holds its maximum of {server.max_connections} "
                                        "connections; retry shortly", "too_many_connections", {"Retry-After": "1"})
            refusal.force_close()  # this connection goes, so the next one finds room
            return refusal
        problem = header_problem(ex.request, server)
        if problem is not None:
            return ex.error_response(431, problem, "request_header_fields_too_large")
        return None

    async def _choose_channel(self, ex: Exchange, runtime: Runtime) -> web.Response | None:
        channels = runtime.channels
        pinned = ex.followed.channel if ex.followed is not None else None
        if pinned is not None:
            ex.pinned_channel = pinned
            channel = channels.get(pinned)
            if channel is not None and channel.serves(ex.route):
                ex.channel = channel
                return None
            # The channel that made the id is gone from config; another may still know it.
        ex.channel = channels.pick(ex.route, ex.model)
        if ex.channel is not None:
            return None
        if channels.candidates(ex.route, ex.model):
            return ex.error_response(503, "every channel for this request is failing; retry shortly",
                                     "no_healthy_channel", headers={"Retry-After": "5"})
        if ex.model is not None:
            return ex.error_response(404, f"model {ex.model!r} is not served by this gateway", "model_not_found")
        return ex.error_response(404, f"no channel serves {ex.route.method} {ex.route.path}", "not_found")

    @staticmethod
    def _upstream_headers(ex: Exchange, runtime: Runtime, id_header: str) -> CIMultiDict[str]:
        request = ex.request
        headers = end_to_end(request.headers)
        is_key = runtime.keys.is_key
        ex.format.strip_client_key(headers, is_key)
        assert ex.target is not None
        if ex.target.keys:  # a keyless route's own `key` pair passes on; a gateway key never does
            ex.target.query += [pair for pair in ex.target.keys if ex.format.keeps_query_key(pair[1], is_key)]
        add_forwarding(headers, ex.client_ip, request.scheme, request.host)
        headers[id_header] = ex.request_id
        if ex.streaming:
            headers["Accept-Encoding"] = "identity"  # the relay must read events, not gzip
        return headers

    async def _forward(self, ex: Exchange, runtime: Runtime, pipeline: Pipeline) -> web.StreamResponse:
        """Send the request to its channel; before the client has a byte, a failure may move it
        to another channel (never back to one already tried), with a growing pause."""
        tried: list[Channel] = []
        delay = runtime.config.resilience.backoff_s
        body, body_changed = ex.body, ex.body_changed  # before any channel's rename
        while True:
            channel = ex.channel
            assert channel is not None and channel.pool is not None
            tried.append(channel)
            path = self._path_for(ex, channel)
            if path is None:
                return self._finish_local(ex, ex.error_response(
                    400, "model: the form's model field must come before its files, so the gateway can name the "
                         "model as this channel knows it", param="model"), runtime.config.server.request_id_header)
            if pipeline.upstream_hooks:
                await pipeline.run_upstream(ex)
            target, data = self._request_for(ex, channel, path)
            span = None
            if ex.span is not None:
                span = self._upstream_span(ex, channel, path, len(tried))
            elif ex.unsampled_span is not None:
                inject(ex.unsampled_span, ex.headers)
            try:
                result = await self._exchange_with(ex, runtime, pipeline, channel, target, data,
                                                   runtime.config.server.request_id_header, tried)
            finally:
                if span is not None:
                    span.set_attribute("http.response.status_code", ex.status)
                    span.end()
            if isinstance(result, web.StreamResponse):
                return result
            ex.channel, reason = result
            runtime.observer.retried(ex, reason)
            await asyncio.sleep(delay)
            delay *= 2
            ex.restore_body(body, body_changed)

    def _path_for(self, ex: Exchange, channel: Channel) -> str | None:
        """The upstream path, built from the route's template, with the model renamed (in the path
        or the body) where the channel knows it by another name; before the on_upstream hooks, so
        they see the channel's name. None when a form's model cannot be renamed (it came late)."""
        assert ex.target is not None
        if ex.followed is not None and ex.followed.upstream_id is not None:
            return ex.target.path(task_id=ex.followed.upstream_id)  # the client holds an alias of it
        if ex.model is None:
            return ex.target.path()
        ex.upstream_model = channel.upstream_model(ex.model)
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
        data: bytes | AsyncIterator[bytes] | None = ex.body
        if ex.body_stream is not None:
            data = ex.body_stream
            if isinstance(data, MultipartBody) and data.declared_length is not None:
                headers["Content-Length"] = str(data.declared_length)
        assert ex.target is not None
        query = ex.target.query_string(ex.format.credential_query(channel.credential))
        return (f"{path}?{query}" if query else path), data

    @staticmethod
    def _upstream_span(ex: Exchange, channel: Channel, path: str, attempt: int) -> Span:
        method = ex.request.method
        span = start_child(ex, f"{method} upstream {channel.name}", SpanKind.CLIENT, {
            "http.request.method": method, "server.address": channel.pool.host if channel.pool else "",
            "url.path": path, "modelgate.channel": channel.name, "gen_ai.request.model": ex.upstream_model or "",
            "modelgate.attempt": attempt})
        inject(span, ex.headers)
        return span

    async def _exchange_with(self, ex: Exchange, runtime: Runtime, pipeline: Pipeline, channel: Channel,
                             target: str, data: bytes | AsyncIterator[bytes] | None, id_header: str,
                             tried: list[Channel]) -> web.StreamResponse | tuple[Channel, str]:
        observer = runtime.observer
        assert channel.pool is not None
        ex.upstream_started = time.perf_counter()
        try:
            upstream = await channel.pool.request(ex.request.method, target, ex.headers, data)
        except TimeoutError as exc:
            connecting = isinstance(exc, ConnectTimeout)
            kind = "connect_timeout" if connecting else "first_byte_timeout"
            observer.upstream_result(channel, kind)
            if (retry := self._retry(ex, runtime, tried, kind)) is not None:
                return retry
            what = "connecting" if connecting else f"waiting {channel.timeouts.first_byte_s:g}s for the first byte"
            return self._finish_local(ex, ex.error_response(504, f"upstream {channel.name} timed out {what}"), id_header)
        except UpstreamError as exc:
            if isinstance(data, MultipartBody) and data.rejection is not None:
                violation = data.rejection  # the body broke a rule while it streamed: the upstream got no whole request
                return self._finish_local(ex, ex.error_response(violation.status, str(violation),
                                                                param=violation.path or None), id_header)
            if isinstance(exc, (RequestBodyFailed, InvalidRequest)):
                # Not the channel's fault: its breaker is left alone, and no other channel would fare better.
                refusal = ex.error_response(400, "the request body could not be read to its end") \
                    if isinstance(exc, RequestBodyFailed) else \
                    ex.error_response(502, f"the request for upstream {channel.name} could not be written: {exc}")
                return self._finish_local(ex, refusal, id_header)
            kind = "connect" if isinstance(exc, ConnectFailed) else "connection"
            observer.upstream_result(channel, kind)
            if (retry := self._retry(ex, runtime, tried, kind)) is not None:
                return retry
            what = "could not be reached" if kind == "connect" else "gave no usable answer"
            message = f"upstream {channel.name} {what} ({type(exc).__name__})"
            status = 503 if ex.route.format is ACCOUNT else 502  # a webhook's sender retries a 503
            return self._finish_local(ex, ex.error_response(status, message), id_header)
        ex.upstream_headers_at = time.perf_counter()
        status = upstream.status
        failure = "status_5xx" if status >= 500 else "status_429" if status == 429 else None
        observer.upstream_result(channel, failure)
        if failure is not None and (failure != "status_429" or runtime.config.resilience.failover_on_429):
            if (retry := self._retry(ex, runtime, tried, failure)) is not None:
                upstream.close()
                return retry
        try:
            relay = Relay(ex, upstream, pipeline, self.affinity,
                          buffer_limit=int(runtime.config.server.max_json_body_mb * 1024 * 1024),
                          request_id_header=id_header, observer=observer,
                          client_idle_s=runtime.config.server.client_idle_s)
            return await relay.send()
        finally:
            upstream.release()

    @staticmethod
    def _retry(ex: Exchange, runtime: Runtime, tried: list[Channel], kind: str) -> tuple[Channel, str] | None:
        """The next channel to try, if this request may be sent again at all."""
        if len(tried) >= runtime.config.resilience.max_attempts:
            return None
        if ex.pinned_channel is not None or ex.body_stream is not None:
            return None  # the id lives on that channel; a streamed body cannot be sent twice
        never_reached = kind in ("connect", "connect_timeout")
        if not never_reached and (ex.route.creates is Pin.VIDEO_TASK or ex.route.format is ACCOUNT):
            return None  # a task submission or a webhook goes again only if it provably never arrived
        following = runtime.channels.pick(ex.route, ex.model, exclude=tuple(tried))
        return (following, kind) if following is not None else None

    @staticmethod
    def _rename_in_body(ex: Exchange) -> bool:
        old, new = ex.model or "", ex.upstream_model or ""
        if isinstance(ex.body_stream, MultipartBody):
            return ex.body_stream.rename_model(old, new)
        body = ex.json()
        if isinstance(body, dict):
            ex.set_json({**body, "model": new})
        return True

    @staticmethod
    def _finish_local(ex: Exchange, response: web.StreamResponse, id_header: str) -> web.StreamResponse:
        if ex.response_headers:
            for name, value in ex.response_headers.items():
                response.headers.setdefault(name, value)
        response.headers[id_header] = ex.request_id
        ex.status = response.status
        return response
