"""Structured logs: JSON lines through structlog, one access line per request.

An access line names the request id, route, model, channel and key name, the status,
durations, tokens and bytes; it never carries a key or a body.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import time

import orjson
import structlog

from proxy.config.model import LoggingConfig
from proxy.exchange import Exchange
from proxy.observability.tracing import ids



class AccessLog:
    """Writes access lines, rendered in batches: a request only leaves its exchange behind, and
    once per event-loop pass (at most 50 ms later) every pending line is built, rendered and
    written in one go. The work leaves the request's own path, and a batch runs with warm
    caches. structlog's renderer is called directly: the bound-logger layer (context copies,
    method proxies) and the stdlib bridge cost more than the line itself."""

    __slots__ = ("_render", "_json", "_second", "_prefix", "_pending", "_scheduled")

    def __init__(self, format: str) -> None:
        self._second = -1
        self._prefix = ""
        self._json = format == "json"
        if self._json:
            self._render = structlog.processors.JSONRenderer(
                serializer=lambda obj, **_: orjson.dumps(obj, default=str))
        else:
            self._render = structlog.dev.ConsoleRenderer(colors=False)
        self._pending: list[tuple[Exchange, float, float]] = []
        self._scheduled = False
        atexit.register(self.flush)

    def add(self, ex: Exchange, now: float) -> None:
        """Log `ex`, finished at perf_counter time `now`."""
        self._pending.append((ex, now, time.time()))
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_later(0.05, self.flush)
            self._scheduled = True
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        render, json_lines = self._render, self._json
        lines = []
        for ex, now, wall in pending:
            line = render(None, "info", self._stamp(_event(ex, now), wall))
            lines.append(line if json_lines else line.encode())  # type: ignore[union-attr]
        try:  # stderr is looked up each time: test runners and daemons swap it
            sys.stderr.buffer.write(b"\n".join(lines) + b"\n")
            sys.stderr.flush()
        except (ValueError, OSError, AttributeError):
            pass

    def _stamp(self, event: dict[str, object], wall: float) -> dict[str, object]:
        """ISO 8601 UTC with microseconds, as structlog's TimeStamper writes it, formatting
        the date and time once per second instead of once per line."""
        second = int(wall)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event["timestamp"] = f"{self._prefix}.{int((wall - second) * 1e6):06d}Z"
        return event


_access = AccessLog("json")


def configure_logging(config: LoggingConfig) -> None:
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if config.format == "json":
        renderer: structlog.types.Processor = structlog.processors.JSONRenderer(
            serializer=lambda obj, **_: orjson.dumps(obj, default=str).decode())
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    level = getattr(logging, config.level.upper())
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    global _access
    _access = AccessLog(config.format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # ours replaces it


def log_exchange(ex: Exchange, config: LoggingConfig, now: float | None = None) -> None:
    if config.access_log:
        _access.add(ex, now if now is not None else time.perf_counter())


def _event(ex: Exchange, now: float) -> dict[str, object]:
    request = ex.request
    event = dict(
        event="request",
        level="info",
        logger="modelgate.access",
        request_id=ex.request_id,
        route=ex.route.name,
        method=request.method,
        path=request.path,
        status=ex.status,
        model=ex.model,
        upstream_model=ex.upstream_model,
        channel=ex.channel.name if ex.channel else None,
        key_name=ex.key_name,
        streaming=ex.streaming,
        duration_ms=round((now - ex.started) * 1000, 3),
        upstream_ms=round(ex.upstream_seconds() * 1000, 3),
        overhead_ms=round(ex.overhead_seconds(now) * 1000, 3),
        input_tokens=ex.usage.input_tokens,
        output_tokens=ex.usage.output_tokens,
        bytes_out=ex.bytes_out,
        client_ip=ex.client_ip,
        client_aborted=ex.client_aborted,
        error=ex.error,
    )
    if (trace_ids := ids(ex)) is not None:
        event["trace_id"], event["span_id"] = trace_ids
    return event
