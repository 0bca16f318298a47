"""Structured logs: JSON lines through structlog, one access line per request.

An access line names the request id, route, model, channel and key name, the status,
durations, tokens and bytes; it never carries a key or a body.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson
import structlog

from proxy.config.model import LoggingConfig
from proxy.exchange import Exchange

_access = structlog.get_logger("modelgate.access")


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
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # ours replaces it


def log_exchange(ex: Exchange, config: LoggingConfig) -> None:
    if not config.access_log:
        return
    total = time.perf_counter() - ex.started
    request = ex.request
    _access.info(
        "request",
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
        duration_ms=round(total * 1000, 3),
        upstream_ms=round(ex.upstream_seconds() * 1000, 3),
        overhead_ms=round(ex.overhead_seconds() * 1000, 3),
        input_tokens=ex.usage.input_tokens,
        output_tokens=ex.usage.output_tokens,
        bytes_out=ex.bytes_out,
        client_ip=ex.client_ip,
        client_aborted=ex.client_aborted,
        error=ex.error,
    )
