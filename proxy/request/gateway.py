"""`Gateway`: the handler every endpoint shares, taking one exchange from client to upstream and back."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time

from aiohttp import web
from multidict import CIMultiDict

from proxy.config.model import ServerConfig
from proxy.core import jsonutil
from proxy.core.drain import SHUTTING_DOWN, Drain
from proxy.core.exchange import BodyTooDeep, Exchange
from proxy.core.headers import add_forwarding, end_to_end
from proxy.core.runtime import Runtime
from proxy.observability.access_log import log_exchange
from proxy.observability.metrics import SHED, child
from proxy.observability.tracing import Tracing, end_request
from proxy.policy.catalog import listing
from proxy.process.admission import RETRY_AFTER_S, Admission, admitted
from proxy.request.affinity import Affinity
from proxy.request.body import BodyError, read_body
from proxy.request.client_guards import ConnectionCount, header_problem
from proxy.request.deciding_fields import resolve_model, settle_json
from proxy.request.forwarder import Forwarder
from proxy.request.target import TargetError, build_target
from proxy.wire.routes import Route

log = logging.getLogger("modelgate.gateway")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Request ids: a random per-process prefix and a counter; unique across instances, and far
# cheaper than a uuid4 (an os.urandom call) per request.
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)
_REFUSALS: dict[tuple[str, str], bytes] = {}  # the body of a 503 refusal, by format and reason


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def answer_id(incoming: str) -> str:
    """The id an answer names: the caller's own when it is a safe one, else a new one."""
    return incoming if incoming and _REQUEST_ID.match(incoming) else new_request_id()


OVERLOADED_MESSAGE = "the gateway is overloaded: it is serving all the requests it can at once; retry shortly"


def refusal_body(route: Route, reason: str, message: str) -> bytes:
    """The body of a 503 refusal on `route`, made once: refusing must stay cheap while the worker is busiest."""
    fmt = route.format
    body = _REFUSALS.get((fmt.name, reason))
    if body is None:
        body = _REFUSALS[fmt.name, reason] = jsonutil.dumps(fmt.error_payload(503, message, reason))
    return body


def _stamped(ex: Exchange, response: web.StreamResponse, id_header: str) -> web.StreamResponse:
    """An answer the gateway made itself (an error, a plugin's answer), at the edge: the headers
    plugins added and the request id, and its status and size in the outcome. A forwarded answer
    whose head went out already was stamped by the relay, the one place that could."""
    if response.prepared:
        return response
    if ex.response_headers:
        for name, value in ex.response_headers.items():
            response.headers.setdefault(name, value)
    response.headers[id_header] = ex.request_id
    if ex.outcome.attempts:  # after attempts, where the time went (a failover's pauses, a pool's wait)
        response.headers["Server-Timing"] = ex.server_timing()
    body = response.body if isinstance(response, web.Response) else None
    size = len(body) if isinstance(body, bytes) else None
    ex.outcome.answered(response.status, 0 if size is not None and ex.request.method == "HEAD" else size)
    return response


def _forget(lookup: asyncio.Task[object]) -> None:
    """A lookup nobody will read: stopped, or its failure taken, so it is not reported as lost."""
    if lookup.done():
        if not lookup.cancelled():
            lookup.exception()
    else:
        lookup.cancel()


class Gateway:
    """Holds the live Runtime and serves each request against the one current when it arrived."""

    __slots__ = ("runtime", "affinity", "tracing", "connections", "forwarder", "in_flight", "drain", "admission")

    def __init__(
        self,
        runtime: Runtime,
        affinity: Affinity,
        tracing: Tracing,
        connections: ConnectionCount | None = None,
        drain: Drain | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.runtime = runtime
        self.affinity = affinity
        self.tracing = tracing
        self.connections = connections or ConnectionCount()
        self.forwarder = Forwarder(affinity, drain)
        self.drain = drain
        self.admission = admission or Admission(runtime.config.server)
        self.in_flight = 0  # every runtime's: a reload swaps the runtime, not the requests running

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        # Admission comes first, from the head alone: a refusal reads no body and runs no plugin.
        # (While the worker sheds, it may have been decided on the connection already: proxy/process/shedding.py.)
        # Taken whatever follows: it was counted as waiting (looked for only while some are). Those
        # still waiting count against the bound here too, as they do on the connections.
        waiting = self.admission.waiting
        admitted_already = waiting > 0 and admitted(request)
        if (
            self.drain is not None
            and self.drain.cutting
            or not (admitted_already or self.admission.admits(self.in_flight + waiting))
        ):
            return self._refuse(request, route)
        runtime = self.runtime
        runtime.enter()
        self.in_flight += 1
        config = runtime.config.server
        incoming_id = request.headers.get(config.request_id_header, "")
        gateway_id = new_request_id()
        # A caller's id is kept for correlation only; what is counted goes by the gateway's own.
        request_id = incoming_id if incoming_id and _REQUEST_ID.match(incoming_id) else gateway_id
        ex = Exchange(request, route, request_id, gateway_id)
        runtime.observer.started(ex)
        response: web.StreamResponse | None = None
        try:
            # Inside: whatever it raises, the request is still ended (counted out, logged, released).
            self.tracing.start_request(ex)
            response = _stamped(ex, await self._serve(ex, runtime), config.request_id_header)
            return response
        except asyncio.CancelledError:
            # The client went away (aiohttp cancelled the handler), or a drain past its cut point did.
            ex.outcome.abandoned(by_drain=self.drain is not None and self.drain.cutting)
            raise
        except BodyTooDeep:
            # Wherever the body is encoded again (a name given twice or escaped, a plugin's change, a
            # channel's model rename): the client's to fix, and what was held is given back as for any end.
            response = ex.error_response(
                400,
                "the body is nested too deeply for the gateway to forward it (at most 254 levels)",
                "invalid_request",
            )
            return _stamped(ex, response, config.request_id_header)
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id, "route": route.name})
            response = ex.error_response(500, "the gateway failed to handle this request")
            return _stamped(ex, response, config.request_id_header)
        finally:
            if ex.follow_lookup is not None:  # answered before the owner was checked (a 401, a 429)
                _forget(ex.follow_lookup)
            try:
                if response is not None and self.drain is not None and self.drain.cutting:
                    # A stream cut by the drain takes its connection with it: the retry its error event
                    # asks for goes to a live gateway. (One that ended by itself keeps its connection a
                    # moment, so a next request already on its way is answered: proxy/core/drain.py.)
                    response.force_close()
                await (ex.pipeline or runtime.routes[route.name].pipeline).run_complete(ex)
                now = time.perf_counter()
                overhead = ex.overhead_seconds(now)  # read once: metrics, trace and access line agree
                runtime.observer.finished(ex, now, overhead)
                end_request(ex, overhead, now - ex.started)
                log_exchange(ex, runtime.config.observability.logging, now, overhead)
            except Exception:  # the answer stands; a reload or shutdown must not wait for this request forever
                log.exception("request bookkeeping failed", extra={"request_id": request_id, "route": route.name})
            finally:
                runtime.leave()
                self.in_flight -= 1

    async def _serve(self, ex: Exchange, runtime: Runtime) -> web.StreamResponse:
        """The request's path, step by step; the first step that answers ends it. Answers the
        gateway makes are returned as they are made, and stamped once, in `handle`."""
        server = runtime.config.server
        refusal = self._refused_by_client_guards(ex, server)
        if refusal is not None:
            return refusal
        try:
            ex.target = build_target(ex.request.raw_path, ex.route.path, ex.path_params)
        except TargetError as exc:
            return ex.error_response(400, str(exc), "invalid_request_target", param=exc.param)
        if ex.route.local:  # `GET /v1/models`, which several SDKs call, speaks the asking one's format
            ex.format = ex.format.shape_for(ex.request.headers, ex.target.key_values())
        settings = runtime.routes[ex.route.name]
        try:
            await read_body(
                ex, settings.body_limit, settings.upload_limit, server.client_idle_s, settings.body_timeout_s
            )
        except BodyError as exc:
            refusal = ex.error_response(exc.status, str(exc), param=exc.param)
            if exc.status == 408:
                refusal.force_close()  # the rest of a stalled body must not be read as the next request
            return refusal
        refusal = resolve_model(ex) or settle_json(ex)
        if refusal is not None:
            return refusal
        ex.headers = self._upstream_headers(ex, runtime, server.request_id_header)  # plugins may edit them
        pipeline = ex.pipeline = settings.pipeline
        # The lookups start together, so they go to the state store with the first call a plugin
        # awaits (its limit check): one round trip. Whose the followed id is, the pipeline checks.
        self.affinity.follow(ex)
        pipeline.run_prefetch(ex)
        answer = await pipeline.run_request(ex, self.affinity.check_owner)
        if answer is None and ex.follow_lookup is not None:  # never forwarded unchecked, whatever a pipeline did
            answer = await self.affinity.check_owner(ex)
        if answer is not None:
            return answer
        if ex.route.local:
            return self._local_answer(ex, runtime)
        refusal = await self._choose_channel(ex, runtime)
        if refusal is not None:
            return refusal
        return await self.forwarder.forward(ex, runtime, ex.pipeline or pipeline)  # narrowed to the plugins taking it

    def _refuse(self, request: web.Request, route: Route) -> web.Response:
        """503 before anything else is done: this worker is at its bound on requests in flight
        (proxy/process/admission.py), or is draining past its cut point, where a request could not
        be finished in time. Counted in a metric; an overloaded worker's refusals get no access line
        each (that would be most of its work; the admission logs them once a second)."""
        config = self.runtime.config.server
        if self.drain is not None and self.drain.cutting:
            reason, retry = SHUTTING_DOWN, "0"  # another instance can answer it now
            message = "this gateway instance is shutting down; retry, another one will answer"
        else:
            reason, retry, message = "overloaded", str(RETRY_AFTER_S), OVERLOADED_MESSAGE
        body = refusal_body(route, reason, message)
        request_id = answer_id(request.headers.get(config.request_id_header, ""))
        child(SHED, route.name, reason).inc()
        if reason == SHUTTING_DOWN:  # few, and the last this instance answers: each gets its access line
            ex = Exchange(request, route, request_id)
            ex.outcome.answered(503)
            ex.outcome.failed(message, reason)
            log_exchange(ex, self.runtime.config.observability.logging, time.perf_counter(), 0.0)
        return web.Response(
            status=503,
            body=body,
            content_type="application/json",
            headers={"Retry-After": retry, config.request_id_header: request_id},
        )

    @staticmethod
    def _local_answer(ex: Exchange, runtime: Runtime) -> web.Response:
        """A route never forwarded that no plugin answered: the models the caller's key may use
        (or one of them), or, for a list only a plugin keeps (the caller's video tasks), a clear 501."""
        assert ex.target is not None
        if ex.route.name not in ("models", "content_models", "model_retrieve", "content_model"):
            return ex.error_response(
                501,
                f"{ex.route.method} {ex.route.path} is answered by a plugin that is not in this route's pipeline",
                "not_implemented",
            )
        body = listing(runtime.config, runtime.channels, ex.key, ex.format, ex.path_params.get("model"))
        if body is None:
            return ex.error_response(
                404, f"model {ex.path_params['model']!r} is not one this key may use here", "model_not_found"
            )
        return web.Response(body=jsonutil.dumps(body), content_type="application/json")

    def _refused_by_client_guards(self, ex: Exchange, server: ServerConfig) -> web.Response | None:
        if self.connections.open > server.max_connections:
            refusal = ex.error_response(
                503,
                f"the gateway holds its maximum of {server.max_connections} connections; retry shortly",
                "too_many_connections",
                {"Retry-After": "1"},
            )
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
            return ex.error_response(
                503,
                "every channel for this request is failing; retry shortly",
                "no_healthy_channel",
                headers={"Retry-After": "5"},
            )
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
