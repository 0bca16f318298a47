"""Translation between the four chat formats (message, content generation, response, chat
completions): a request of one served by a channel of another, both ways, JSON and streamed.

One `Translation` per request and upstream format: the client's reader and the upstream's
writer for the request; the upstream's reader and the client's writer for its answer, error or
stream. Pure functions over parsed bodies and, for streams, a state machine per direction (no
I/O); the forwarder and the relay call them (proxy/request/).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from multidict import CIMultiDict

from proxy.core import jsonutil
from proxy.formats.base import Format
from proxy.formats.translation.chat import ChatCodec
from proxy.formats.translation.codec import Codec, Query, UnknownAnswer, read_fault
from proxy.formats.translation.content import ContentCodec
from proxy.formats.translation.ir import Ask, Failed, Fault, Finish, Untranslatable
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
DROPPED_HEADER = "X-Translation-Dropped"

__all__ = ["CODECS", "ROUTES", "Translation", "Untranslatable", "read_ask"]


# What a reader or writer meets in a value of a shape it did not expect (a request the schema let
# through, an upstream's answer): never a 500, but the client's 400, or the upstream's 502.
_MISSHAPEN = (KeyError, TypeError, AttributeError, IndexError, UnknownAnswer)


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

    __slots__ = ("client", "upstream", "ask", "body")

    def __init__(self, client: Format, upstream: Format, ask: Ask, model: str) -> None:
        self.client, self.upstream = CODECS[client.name], CODECS[upstream.name]
        # The writers note what they leave out: a copy per attempt, so one channel's notes are its own.
        self.ask = dataclasses.replace(ask, model=model, dropped=list(ask.dropped))
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
        return self.ask.dropped

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
            headers[DROPPED_HEADER] = ", ".join(dict.fromkeys(self.ask.dropped))
        return headers

    def answer(self, status: int, body: bytes) -> tuple[int, dict[str, Any]]:
        """A whole answer in the client's format (parsed: whoever reads it next need not parse it
        again), and its status: a success; an error, with the upstream's status; or, for a
        success the gateway cannot read, its 502."""
        parsed = jsonutil.parsed(body)
        if status >= 300:
            return status, self.client.write_fault(read_fault(status, parsed))
        try:
            if isinstance(parsed, dict):
                return status, self.client.write_reply(self.upstream.read_reply(parsed), self.ask)
        except _MISSHAPEN:
            pass
        return UNREADABLE.status, self.client.write_fault(UNREADABLE)

    def stream(self) -> StreamTranslation:
        return StreamTranslation(self)


class StreamTranslation:
    """The upstream's events in, the client's out, one event at a time (nothing held back
    beyond what a format sends whole: a content-generation client's tool call)."""

    __slots__ = ("reader", "writer", "ended")

    def __init__(self, translation: Translation) -> None:
        self.reader = translation.upstream.reader()
        self.writer = translation.client.writer(translation.ask)
        self.ended = False

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
            for piece in pieces:
                out += self.writer.feed(piece)
                self.ended = self.ended or isinstance(piece, Finish | Failed)
        return out

    def end(self) -> list[SSEEvent]:
        """What the upstream's end of stream completes: the client's closing events, or, when
        the upstream ended without finishing its answer, the client's error event."""
        out: list[SSEEvent] = []
        if not self.ended:
            for piece in self.reader.end():
                out += self.writer.feed(piece)
                self.ended = self.ended or isinstance(piece, Finish | Failed)
        if not self.ended:
            self.ended = True
            out += self.writer.feed(
                Failed(Fault(502, "the upstream ended its stream before its answer finished", "upstream_broke_off"))
            )
        return out
