"""Translation between the four chat formats (message, content generation, response, chat
completions): a request of one served by a channel of another, both ways, JSON and streamed.

One `Translation` per request and upstream format: the client's reader and the upstream's
writer for the request; the upstream's reader and the client's writer for its answer, error or
stream. Pure functions over parsed bodies and, for streams, a state machine per direction (no
I/O); the forwarder and the relay call them (proxy/request/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from multidict import CIMultiDict

from proxy.core import jsonutil
from proxy.core.usage import Usage
from proxy.formats.base import Format
from proxy.formats.translation.chat import ChatCodec
from proxy.formats.translation.codec import Codec, Query, TooLarge, UnknownAnswer, read_fault
from proxy.formats.translation.content import ContentCodec
from proxy.formats.translation.ir import Ask, Begin, Counts, Failed, Fault, Finish, Piece, Untranslatable
from proxy.formats.translation.message import MessageCodec
from proxy.formats.translation.response import ResponseCodec
from proxy.wire.sse import SSEEvent

CODECS: dict[str, Codec] = {
    codec.format.name: codec for codec in (MessageCodec(), ContentCodec(), ResponseCodec(), ChatCodec())
}
# The routes whose requests may be served in another format: each chat format's generation.
ROUTES = frozenset({"messages", "generate_content", "stream_generate_content", "responses", "chat_completions"})
# What of the client's headers goes to an upstream of another format: none of its format's own
# (versions, betas, an SDK's telemetry), only the request's identity and trace.
_KEPT = ("traceparent", "tracestate", "user-agent", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host")
MESSAGE_VERSION = "2023-06-01"  # the message format's version the translation writes
UPSTREAM_FORMAT_HEADER = "X-Upstream-Format"
UNREADABLE = Fault(502, "the upstream's answer could not be read to be translated", "upstream_bad_answer")
TOO_LARGE = Fault(502, "the upstream's answer is too large to translate", "upstream_answer_too_large")
UNFINISHED = Fault(502, "the upstream ended its stream before its answer finished", "upstream_broke_off")
DROPPED_HEADER = "X-Translation-Dropped"
_NAMED_AT_MOST = 20  # fields the header names (one a message, in a long conversation, would make it huge)

__all__ = ["CODECS", "ROUTES", "Translation", "Untranslatable", "read_ask"]


# What a reader or writer meets in a value of a shape it did not expect (a request the schema let
# through, an upstream's answer): never a 500, but the client's 400, or the upstream's 502.
_MISSHAPEN = (KeyError, TypeError, AttributeError, IndexError, RecursionError, UnknownAnswer)


def read_ask(client: Format, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
    """A client's request in the translation's words; Untranslatable names what cannot go."""
    if not isinstance(body, dict):
        raise Untranslatable("body", "must be a JSON object")
    try:
        return CODECS[client.name].read_ask(body, path_model, streaming, query)
    except _MISSHAPEN as exc:
        raise Untranslatable(
            "body", f"holds a value of a shape the gateway cannot translate ({type(exc).__name__})"
        ) from None


class Translation:
    """One request of the client's format, sent in the upstream's."""

    __slots__ = ("client", "upstream", "ask", "body", "redact", "counts")

    def __init__(
        self,
        client: Format,
        upstream: Format,
        ask: Ask,
        model: str,
        redact: Callable[[str], str] = str,
        stream_usage: bool = True,
    ) -> None:
        """`redact`: takes the channel's credential out of the upstream's words; `stream_usage`:
        whether a chat-completions channel takes `stream_options` (`channels[].stream_usage`)."""
        self.client, self.upstream = CODECS[client.name], CODECS[upstream.name]
        self.redact = redact
        self.counts: Counts | None = None  # what the upstream counted for a whole answer
        # The request as read for this attempt (read afresh for each: the writers note in it what
        # they leave out, so one channel's notes are its own); the translation's from here on.
        self.ask = ask
        ask.model = model
        if upstream.name == "chat" and not stream_usage:
            self.ask.stream_usage = False  # (the only reader of it then is the upstream's writer)
        try:
            self.body = jsonutil.dumps(self.upstream.write_ask(self.ask))
        except _MISSHAPEN as exc:
            raise Untranslatable(
                "body", f"holds a value the upstream's format cannot carry ({type(exc).__name__})"
            ) from None
        except jsonutil.JSONEncodeError as exc:
            raise Untranslatable("body", f"cannot be encoded for the upstream ({exc})") from None

    @property
    def upstream_format(self) -> str:
        return self.upstream.format.name

    @property
    def dropped(self) -> list[str]:
        return list(self.ask.dropped)

    def target(self, versioned: Any) -> str:
        """The upstream path and query (`versioned`: the channel's API version for the path)."""
        path, query = self.upstream.upstream_path(self.ask)
        path = versioned(path)
        return f"{path}?{'&'.join(f'{k}={v}' for k, v in query)}" if query else path

    def headers(self, sent: CIMultiDict[str], id_header: str) -> CIMultiDict[str]:
        """The upstream's request headers, built from the few of the client's that say who and
        which trace it is; the channel's credential and version are placed after."""
        headers: CIMultiDict[str] = CIMultiDict()
        for name in (*_KEPT, id_header):
            for value in sent.getall(name, ()):
                headers.add(name, value)
        headers["Content-Type"] = "application/json"
        headers["Accept-Encoding"] = "identity"  # the gateway reads every answer it translates
        if self.ask.stream:
            headers["Accept"] = "text/event-stream"
        return headers

    def response_headers(self) -> dict[str, str]:
        headers = {UPSTREAM_FORMAT_HEADER: self.upstream.format.name}
        if self.ask.dropped:
            named = list(self.ask.dropped)
            more = f", and {len(named) - _NAMED_AT_MOST} more" if len(named) > _NAMED_AT_MOST else ""
            headers[DROPPED_HEADER] = ", ".join(named[:_NAMED_AT_MOST]) + more
        return headers

    def answer(self, status: int, body: bytes) -> tuple[int, dict[str, Any]]:
        """A whole answer in the client's format (parsed: whoever reads it next need not parse it
        again), and its status: a success; an error, with the upstream's status; or, for a
        success the gateway cannot read, its 502."""
        parsed = jsonutil.parsed(body)
        if status >= 300:
            fault = read_fault(status, parsed)
            return status, self.client.write_fault(dataclasses.replace(fault, message=self.redact(fault.message)))
        try:
            if isinstance(parsed, dict):
                reply = self.upstream.read_reply(parsed)
                answer = self.client.write_reply(reply, self.ask)
                self.counts = reply.counts
                return status, answer
        except _MISSHAPEN:
            pass
        return self.unreadable()

    def unreadable(self) -> tuple[int, dict[str, Any]]:
        """The client's answer for an upstream's answer the gateway cannot read (or encode again:
        a number past 64 bits, say); it counted nothing the gateway can book."""
        self.counts = None
        return UNREADABLE.status, self.client.write_fault(UNREADABLE)

    def usage(self) -> Usage:
        """What the upstream counted for a whole answer, as the gateway books it."""
        return usage_of(self.counts)

    def stream(self, limit: int | None = None) -> StreamTranslation:
        """The answer's stream translated; `limit`: what its writer may hold (StreamWriter.limit)."""
        return StreamTranslation(self, limit)


class StreamTranslation:
    """The upstream's events in, the client's out, one event at a time (nothing held back
    beyond what a format sends whole: a content-generation client's tool call). What the
    upstream counted, and how its stream ended, are kept for the gateway's own books."""

    __slots__ = ("reader", "writer", "redact", "ended", "counts", "closed", "fault", "unfinished")

    def __init__(self, translation: Translation, limit: int | None = None) -> None:
        self.reader = translation.upstream.reader()
        self.writer = translation.client.writer(translation.ask)
        if limit is not None:
            self.writer.limit = limit
        self.redact = translation.redact
        self.ended = False
        self.counts = Counts()  # the upstream's own, as far as it said them
        self.closed = False  # its closing counts came (an opening count is a placeholder, never final)
        self.fault: Fault | None = None  # how the stream failed, when it did
        self.unfinished = False  # the upstream ended it before its answer finished

    def feed(self, events: list[SSEEvent]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        for event in events:
            if event.is_comment:
                out.append(event)  # a keep-alive ping is every format's
                continue
            if self.ended:
                continue
            try:
                pieces = self.reader.feed(event)
            except _MISSHAPEN:
                pieces = [Failed(UNREADABLE)]
            out += self._write(pieces)
        return out

    def end(self) -> list[SSEEvent]:
        """What the upstream's end of stream completes: the client's closing events, or, when
        the upstream ended without finishing its answer, the client's error event."""
        out: list[SSEEvent] = []
        if not self.ended:
            out += self._write(self.reader.end())
        if not self.ended:
            self.unfinished = True
            out += self._write([Failed(UNFINISHED)])
        return out

    def usage(self) -> Usage:
        usage = usage_of(self.counts)
        usage.final = usage.final and self.closed
        return usage

    def _write(self, pieces: list[Piece]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        for piece in pieces:
            if isinstance(piece, Begin | Finish) and piece.counts is not None:
                merged(self.counts, piece.counts)
                self.closed = self.closed or isinstance(piece, Finish)
            if isinstance(piece, Failed):
                fault = piece.fault
                code = self.redact(fault.code) if fault.code is not None else None
                piece = Failed(dataclasses.replace(fault, message=self.redact(fault.message), code=code))
                self.fault = piece.fault
            try:
                out += self.writer.feed(piece)
            except (*_MISSHAPEN, jsonutil.JSONEncodeError) as exc:  # an upstream's values no client format holds
                self.fault = TOO_LARGE if isinstance(exc, TooLarge) else UNREADABLE
                out += self.writer.failed(self.fault)
                self.ended = True
                break
            self.ended = self.ended or isinstance(piece, Finish | Failed)
            if self.ended:
                break
        return out


def merged(into: Counts, found: Counts) -> None:
    """What a later count says, over what an earlier one did."""
    for name in ("input", "output", "cache_read", "cache_write", "reasoning"):
        value = getattr(found, name)
        if value is not None:
            setattr(into, name, value)


def usage_of(counts: Counts | None) -> Usage:
    """The gateway's usage from what an upstream counted: its last word only where it said both
    the prompt and the output (else the gateway's estimate fills the rest)."""
    if counts is None:
        return Usage()
    found = [_count(value) for value in (counts.input, counts.output, counts.cache_read, counts.reasoning)]
    return Usage(*found, final=found[0] is not None and found[1] is not None)


def _count(value: int | None) -> int | None:
    """A count the gateway books: a whole number from 0 up to 2**53 (what a metric holds exactly)."""
    return value if value is not None and 0 <= value <= 2**53 else None
