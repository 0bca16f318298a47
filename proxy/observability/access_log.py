"""Structured logs: JSON lines through structlog, one access line per request.

An access line names the request id, route, model, channel and key name, the status,
durations, tokens and bytes, its trace's ids while tracing is on, and a link to the trace in the
trace viewer once it is exported (`tracing.viewer_url`); it never carries a key or a body. Its
text, and every other log line's, is shown as proxy/observability/safe_text.py makes it: a model name a client chose
cannot steer a terminal or hide in the line.
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
from proxy.core.exchange import Exchange
from proxy.observability.safe_text import shown, shown_fields
from proxy.observability.tracing import ids


class AccessLog:
    """Writes access lines without structlog's bound-logger layer (context copies, method
    proxies) or the stdlib bridge, which cost more than the line itself: a JSON line is orjson's
    output, as structlog's JSONRenderer would make it; a console line is structlog's renderer's."""

    __slots__ = ("_render", "_sink", "_second", "_prefix")

    def __init__(self, format: str) -> None:
        self._second = -1
        self._prefix = ""
        self._render = None if format == "json" else structlog.dev.ConsoleRenderer(colors=False)
        self._sink = BufferedLines()

    def _stamp(self, event: dict[str, object]) -> dict[str, object]:
        """ISO 8601 UTC with microseconds, as structlog's TimeStamper writes it, formatting
        the date and time once per second instead of once per line."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1e6):06d}Z"
        return event

    def write(self, event: dict[str, object]) -> None:
        if self._render is None:
            self._sink.msg(orjson.dumps(self._stamp(event), default=str))
        else:
            self._sink.msg(self._render(None, "info", self._stamp(event)).encode())  # type: ignore[union-attr]


class BufferedLines:
    """A structlog sink that writes lines in batches: one write per event-loop pass (at most
    50 ms later), not one per request. Lines are flushed at exit and when the loop is not running."""

    __slots__ = ("_lines", "_flush_on")

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop a flush is due on
        atexit.register(self.flush)

    def msg(self, message: bytes) -> None:
        self._lines.append(message)
        # A loop that closed before its flush ran (tests run one loop after another) must not
        # hold the lines back until exit.
        if self._flush_on is not None and not self._flush_on.is_closed():
            return
        try:
            self._flush_on = asyncio.get_running_loop()
            self._flush_on.call_later(0.05, self.flush)
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        self._flush_on = None
        if self._lines:
            lines, self._lines = self._lines, []
            try:  # stderr is looked up each time: test runners and daemons swap it
                sys.stderr.buffer.write(b"\n".join(lines) + b"\n")
                sys.stderr.flush()
            except (ValueError, OSError, AttributeError):
                pass


_access = AccessLog("json")


def configure_logging(config: LoggingConfig) -> None:
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if config.format == "json":
        renderer: structlog.types.Processor = structlog.processors.JSONRenderer(
            serializer=lambda obj, **_: orjson.dumps(obj, default=str).decode()
        )
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
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _shown,
                structlog.processors.format_exc_info,
                renderer,
            ],
            # Each line names its logger (modelgate.validation, modelgate.ledger ...), as access lines do,
            # so a log pipeline can pick out one part's lines.
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, structlog.stdlib.ExtraAdder()],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    global _access
    _access = AccessLog(config.format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # ours replaces it


def _shown(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
    """Every text of a log line shown safely (the traceback, added after, keeps its lines)."""
    return shown_fields(event)


def _shown_text(text: str | None) -> str | None:
    return shown(text) if text else text


def log_exchange(ex: Exchange, config: LoggingConfig, now: float, overhead_s: float) -> None:
    """The request's access line; `now` and `overhead_s` are the ones its metrics recorded."""
    if not config.access_log:
        return
    request = ex.request
    usage = ex.usage
    channel = ex.channel
    event = {
        "event": "request",
        "level": "info",
        "logger": "modelgate.access",
        "request_id": ex.request_id,
        "route": ex.route.name,
        "method": request.method,
        "path": ex.route.path,  # the template: a client's path may hold anything, a key included
        "status": ex.outcome.status,
        # What a client chose, or an error quoting it, is shown safely; the rest is the gateway's own.
        "model": _shown_text(ex.model),
        "upstream_model": _shown_text(ex.upstream_model),
        "channel": channel.name if channel is not None else None,
        "upstream_format": ex.upstream_format,
        "key_name": ex.key_name,
        "streaming": ex.streaming or ex.outcome.streamed,
        "duration_ms": round((now - ex.started) * 1000, 3),
        "upstream_ms": round(ex.outcome.upstream_seconds() * 1000, 3),
        "overhead_ms": round(overhead_s * 1000, 3),
        "backoff_ms": round(ex.outcome.backoff_s * 1000, 3),  # neither the gateway's time nor the upstream's
        "pool_wait_ms": round(ex.outcome.pool_wait_s * 1000, 3),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "bytes_out": ex.outcome.bytes_out,
        "client_ip": _shown_text(ex.client_ip),
        "client_aborted": ex.outcome.client_aborted,
        "error": _shown_text(ex.outcome.error),
    }
    if (trace_ids := ids(ex)) is not None:
        event["trace_id"], event["span_id"] = trace_ids
        if ex.trace.link is not None:  # exported, and a viewer named: the line leads to the trace
            event["trace_url"] = ex.trace.link
    _access.write(event)
