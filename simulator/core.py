"""The simulator's shared parts: per-request knobs, the request log, upstream auth, the SSE writer.

Knobs come from the simulator's settings and can be overridden per request with headers:
  x-sim-latency-ms       delay before the answer's headers
  x-sim-chunk-delay-ms   delay between stream events
  x-sim-output-tokens    length of generated text
  x-sim-fault            status=NNN | drop-after=N (events, then the connection dies) |
                         stall-after=N (events, then silence)
  x-sim-comments: 1      a `: ping` comment line before every event
  x-sim-crlf: 1          CRLF line endings in streams
  x-sim-split: 1         every event written in two network writes
  x-sim-image-markdown: 1  content-generation image answers embed the image as a Markdown data URL
  x-sim-no-usage: 1      answers and streams say nothing of their usage
  x-sim-background-ms    how long a background response runs before it completes (default 0)
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.config.model import SimulatorSettings
from proxy.core import jsonutil
from proxy.formats import Format
from proxy.formats.base import KeyLocation
from proxy.wire.multipart import MultipartObserver

_WORDS = (
    "the quick brown fox jumps over a lazy dog while simulated models answer every "
    "request with plain deterministic words"
).split()
_RECORDED_BODY_LIMIT = 1024 * 1024
_BOOKKEEPING = 10_000  # entries kept per kind (stored responses, tasks, per-request counters)


@dataclass(slots=True)
class Knobs:
    latency_ms: float
    chunk_delay_ms: float
    output_tokens: int
    fault_status: int | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    comments: bool = False
    crlf: bool = False
    split: bool = False
    no_usage: bool = False
    background_ms: float = 0.0

    @classmethod
    def from_request(cls, settings: SimulatorSettings, request: web.Request) -> Knobs:
        h = request.headers
        knobs = cls(
            latency_ms=float(h.get("x-sim-latency-ms", settings.latency_ms)),
            chunk_delay_ms=float(h.get("x-sim-chunk-delay-ms", settings.chunk_delay_ms)),
            output_tokens=max(1, int(h.get("x-sim-output-tokens", settings.output_tokens))),
            comments=h.get("x-sim-comments") == "1",
            crlf=h.get("x-sim-crlf") == "1",
            split=h.get("x-sim-split") == "1",
            no_usage=h.get("x-sim-no-usage") == "1",
            background_ms=float(h.get("x-sim-background-ms", 0)),
        )
        if settings.fail_status is not None:
            knobs.fault_status = settings.fail_status
        fault = h.get("x-sim-fault", "")
        name, _, value = fault.partition("=")
        if name == "status":
            knobs.fault_status = int(value)
        elif name == "drop-after":
            knobs.drop_after = int(value)
        elif name == "stall-after":
            knobs.stall_after = int(value)
        return knobs


@dataclass(slots=True)
class RecordedRequest:
    """What the simulator received: what tests inspect to see what an upstream sees."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body_size: int = 0
    body_sha256: str = ""
    body: bytes | None = None
    form: dict[str, str] = field(default_factory=dict)
    files: int = 0

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body_size": self.body_size,
            "body_sha256": self.body_sha256,
            "body": self.body.decode("utf-8", "replace") if self.body is not None else None,
            "form": self.form,
            "files": self.files,
        }


class Simulator:
    """One simulated upstream: its settings, what it has stored, and what it has seen."""

    def __init__(self, name: str, settings: SimulatorSettings, key: str | None = None) -> None:
        self.name = name
        self.settings = settings
        self.key = key
        self.requests: deque[RecordedRequest] = deque(maxlen=5000)
        self.status_calls: Counter[str] = Counter()
        self.open_streams = 0
        self.streams_started = 0
        self.aborted = 0
        # Token usage this upstream reported in full (a stream's counts once its last event is made),
        # and the answers that carried it: what a ledger of the gateway's must add up to.
        self.reported = {"answers": 0, "input_tokens": 0, "output_tokens": 0}
        # What this upstream made, whether or not anyone was told (a stream's tokens as each event
        # is made, a background response's when it starts, a video's seconds, images): what it
        # would bill, and what a gateway's charges must account for.
        self.produced: dict[str, float] = {"input_tokens": 0, "output_tokens": 0, "images": 0, "video_seconds": 0.0}
        self.events_sent: Counter[str] = Counter()  # by the caller's X-Request-Id
        self.stream_digests: dict[str, str] = {}  # sha256 of the exact bytes streamed
        self.responses: dict[str, dict[str, Any]] = {}
        self.videos: dict[str, Any] = {}
        self.files: dict[str, bytes] = {}
        self._ids = itertools.count(1)

    def remember(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        """Keep test bookkeeping bounded: the simulator also runs as a long-lived default upstream."""
        mapping[key] = value
        while len(mapping) > _BOOKKEEPING:
            del mapping[next(iter(mapping))]

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{self.name}_{next(self._ids)}_{uuid.uuid4().hex[:8]}"

    def knobs(self, request: web.Request) -> Knobs:
        return Knobs.from_request(self.settings, request)

    async def receive(self, request: web.Request, fmt: Format) -> tuple[Any, Knobs]:
        """Record the request, check its upstream key, apply latency and faults; the JSON body back."""
        request[_FORMAT] = fmt  # an answer to a failure below is in this format's error shape
        record = RecordedRequest(
            request.method,
            request.path,
            request.raw_path.partition("?")[2],
            [(str(k), v) for k, v in request.headers.items()],
        )
        self.requests.append(record)
        digest = hashlib.sha256()
        body = bytearray()
        observer = (
            MultipartObserver.for_content_type(request.headers.get("content-type", ""))
            if request.content_type == "multipart/form-data"
            else None
        )
        while chunk := await request.content.read(256 * 1024):
            digest.update(chunk)
            record.body_size += len(chunk)
            if observer is not None:
                observer.feed(chunk)
            else:
                body += chunk
        record.body_sha256 = digest.hexdigest()
        knobs = self.knobs(request)
        self._check_key(request, fmt)
        if observer is not None:
            record.form = {p.name: p.value.decode("utf-8", "replace") for p in observer.parts if p.value is not None}
            record.files = len(observer.files())
            payload: Any = record.form
        else:
            record.body = bytes(body) if record.body_size <= _RECORDED_BODY_LIMIT else None
            try:
                payload = jsonutil.loads(body) if body else {}
            except jsonutil.JSONDecodeError:
                payload = None
        if knobs.latency_ms:
            await asyncio.sleep(knobs.latency_ms / 1000)
        if knobs.fault_status:
            headers = {"Retry-After": "7"} if knobs.fault_status == 429 else None
            raise Answer(
                fmt.error_response(
                    knobs.fault_status, f"simulated upstream fault {knobs.fault_status}", headers=headers
                )
            )
        return payload, knobs

    def _check_key(self, request: web.Request, fmt: Format) -> None:
        if fmt.key_location is KeyLocation.NONE or self.key is None:
            return  # started without a key: an open upstream
        presented = fmt.client_key(request.headers, request.query.getall("key", []))  # any place a real upstream reads
        if presented != self.key:
            raise Answer(fmt.error_response(401, "simulated upstream: invalid or missing API key"))

    def report(self, input_tokens: int, output_tokens: int) -> None:
        """An answer's final usage is made (its body, or a stream's last usage event)."""
        self.reported["answers"] += 1
        self.reported["input_tokens"] += input_tokens
        self.reported["output_tokens"] += output_tokens

    def produce(
        self, input_tokens: int = 0, output_tokens: int = 0, images: int = 0, video_seconds: float = 0.0
    ) -> None:
        """Tokens, images or video seconds made (see `produced`)."""
        produced = self.produced
        produced["input_tokens"] += input_tokens
        produced["output_tokens"] += output_tokens
        produced["images"] += images
        produced["video_seconds"] += video_seconds

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": len(self.requests),
            "open_streams": self.open_streams,
            "streams_started": self.streams_started,
            "aborted": self.aborted,
            "reported": dict(self.reported),
            "produced": dict(self.produced),
            "status_calls": dict(self.status_calls),
        }


_FORMAT = web.RequestKey("simulator.format", Format)  # the format the request's handler reads it as
_STREAMING = web.RequestKey("simulator.streaming", bool)
log = logging.getLogger("modelgate.simulator")


class Answer(Exception):
    """Ends a simulator handler early with a ready response (auth failures, injected faults)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def answer_early(sim: Simulator) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except Answer as answer:
            return answer.response
        except (asyncio.CancelledError, ConnectionError):
            sim.aborted += 1  # the caller went away before the answer was complete
            raise
        except web.HTTPException:
            raise  # aiohttp's own answers (no such route, method not allowed)
        except Exception:
            # A request this simulator did not foresee: answered as an upstream would, in the
            # format's error shape (aiohttp's own 500 is plain text no client parses), and logged.
            log.exception("simulator failed answering %s %s", request.method, request.path)
            if request.get(_STREAMING):
                raise
            fmt = request.get(_FORMAT)
            message = "simulated upstream: internal error"
            if fmt is not None:
                return fmt.error_response(500, message)
            return web.json_response({"error": {"message": message, "type": "api_error"}}, status=500)

    return middleware


def words(count: int, start: int = 0) -> list[str]:
    return [_WORDS[(start + i) % len(_WORDS)] for i in range(count)]


def count_words(value: Any) -> int:
    """A rough token count of everything textual in a request."""
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, dict):
        return sum(
            count_words(v)
            for k, v in value.items()
            if k not in ("data", "b64_json", "image_url", "role", "type", "mime_type", "mimeType")
        )
    if isinstance(value, list):
        return sum(count_words(v) for v in value)
    return 0


def now() -> int:
    return int(time.time())


def json_answer(
    payload: Any, request: web.Request, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer, gzip-compressed when the caller accepts it, as real upstreams do."""
    body = jsonutil.dumps(payload)
    response = web.Response(status=status, body=body, content_type="application/json", headers=headers)
    if len(body) >= 256 and "gzip" in request.headers.get("accept-encoding", ""):
        response.enable_compression(web.ContentCoding.gzip)
    return response


def sse(name: str | None, payload: Any) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + jsonutil.dumps(payload) + b"\n\n"


async def stream(sim: Simulator, request: web.Request, knobs: Knobs, events: Iterable[bytes]) -> web.StreamResponse:
    """Write events with the knobs' pacing and faults; count streams the caller abandons."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    request[_STREAMING] = True  # its headers are sent: a failure now can only cut it
    sim.open_streams += 1
    sim.streams_started += 1
    delay = knobs.chunk_delay_ms / 1000
    request_id = request.headers.get("x-request-id", "")
    digest = hashlib.sha256()
    try:
        for index, raw in enumerate(events):
            if knobs.drop_after is not None and index >= knobs.drop_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            if knobs.stall_after is not None and index >= knobs.stall_after:
                await asyncio.sleep(3600)
            if index and delay:
                await asyncio.sleep(delay)
            if knobs.comments:
                raw = b": ping\n\n" + raw
            if knobs.crlf:
                raw = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
            if knobs.split and len(raw) > 2:
                half = len(raw) // 2
                await response.write(raw[:half])
                await asyncio.sleep(max(delay / 4, 0.005))
                digest.update(raw[:half])
                raw = raw[half:]
            await response.write(raw)
            digest.update(raw)
            sim.remember(sim.events_sent, request_id, sim.events_sent[request_id] + 1)
        await response.write_eof()
    finally:
        sim.open_streams -= 1
        sim.remember(sim.stream_digests, request_id, digest.hexdigest())
    return response
