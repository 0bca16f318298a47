"""Sending the upstream's answer to the client, in one of three ways.

- SSE: cut into events as they arrive, each network read written out at once
  (never buffered, never an event behind, until the closing counts: below); per-event hooks see
  each event. An event is held until its blank line comes (one ending in a CR, until the next
  byte, or the stream's end, says whether a LF belongs to it), up to `max_event` bytes: past that
  the stream ends with the format's error event and the upstream connection is closed.
- Buffered: read whole (within a limit) when a plugin or affinity must see the body.
- Bytes: streamed through untouched (downloads, answers nobody needs to read).

Whichever way, the channel's credential is taken out of the headers and the body of every
answer that is not a success (an error quoting the request, a redirect), and out of the
URL-carrying headers of a success: the upstream is trusted with the credential, the client never is.

Whichever way too, the relay never ends an answer: aiohttp writes its end once the handler has
returned, after the request's bookkeeping (the plugins' on_complete, where the ledger journals
its record), so no client holds a whole answer whose record a killed process could still lose. A
buffered answer's body goes then; a stream's events from the one carrying its closing counts (an
SDK has its whole answer with them), or from the one that makes its answer whole where the counts
follow apart (a chat stream's last finish: Outcome.answer_whole), and the last bytes of an answer
of known length, go with its end (`DeferredEnd`).
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.core import jsonutil
from proxy.core.drain import SHUTTING_DOWN, Drain
from proxy.core.exchange import Exchange
from proxy.core.headers import content_codings, end_to_end
from proxy.core.phase import phase
from proxy.core.pipeline import Pipeline
from proxy.core.upstream_response import AnswerTooLarge, UpstreamResponse
from proxy.core.usage import Usage
from proxy.formats.translation import StreamTranslation
from proxy.observability.observer import Observer
from proxy.request.client_guards import ReaderWatch
from proxy.request.redact import Redactor, StreamRedactor
from proxy.upstream import ResponseStream, UpstreamError
from proxy.wire.routes import Pin
from proxy.wire.sse import EventTooLarge, SSEEvent, SSEParser

if TYPE_CHECKING:
    from proxy.policy.channels import Channel
    from proxy.request.affinity import Affinity

log = logging.getLogger("modelgate.relay")

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_CLIENT_GONE = (ConnectionResetError, ConnectionError)
# Headers of a success that carry a URL, where an upstream may echo the query it was sent (and
# the credential in it); a success's other headers, and its body, are passed as they are.
_LINKS = ("location", "content-location", "link", "refresh", "operation-location", "azure-asyncoperation")
_UPSTREAM_BROKE = (UpstreamError,)
_CUT_MESSAGE = "the gateway is shutting down; send the request again"
_REVOKED_MESSAGE = "the API key this stream runs under was revoked"
REVOKED = "api_key_revoked"


class Relay:
    """Writes one upstream answer to the client for one exchange."""

    __slots__ = (
        "ex",
        "upstream",
        "pipeline",
        "affinity",
        "buffer_limit",
        "request_id_header",
        "observer",
        "client_idle_s",
        "redactor",
        "drain",
        "was_cut",
        "max_event",
        "translating",
    )

    def __init__(
        self,
        ex: Exchange,
        upstream: ResponseStream,
        pipeline: Pipeline,
        affinity: Affinity,
        buffer_limit: int,
        max_event: int,
        request_id_header: str,
        observer: Observer,
        client_idle_s: float = 30.0,
        drain: Drain | None = None,
    ) -> None:
        self.drain = drain
        self.max_event = max_event
        self.was_cut: str | None = None  # why the gateway ended it: SHUTTING_DOWN or REVOKED
        self.client_idle_s = client_idle_s
        self.ex = ex
        self.upstream = upstream
        self.pipeline = pipeline
        self.affinity = affinity
        self.buffer_limit = buffer_limit
        self.request_id_header = request_id_header
        self.observer = observer
        self.redactor: Redactor | None = ex.channel.redactor if ex.channel is not None else None
        # A stream's events, from the upstream's format to the client's (set for a translated stream).
        self.translating: StreamTranslation | None = None

    async def send(self) -> web.StreamResponse:
        upstream = self.upstream
        ex = self.ex
        length = upstream.content_length
        if ex.translation is not None:
            return await self._send_translated()
        if upstream.status >= 300 and self.redactor is not None:
            # Not a success: read (error answers are small) so the credential can be taken out.
            if length is None or length <= self.buffer_limit:
                return await self._send_buffered()
            return self._unredactable() if content_codings(upstream.headers) else await self._send_bytes()
        if upstream.content_type == "text/event-stream" and not content_codings(upstream.headers):
            ex.outcome.stream_began()
            return await self._send_events()
        wants_body = self.pipeline.reads_answers or (ex.route.creates is not None and upstream.status < 300)
        if ex.answer_limit is not None and upstream.status < 300:
            if length is not None and length > ex.answer_limit.size:
                upstream.close()
                return ex.answer_limit.refusal(ex)
            return await self._send_buffered()
        # A download streams; its error answers (small) are buffered so plugins can make them clear.
        readable = not ex.route.streams_bytes or upstream.status >= 400
        if wants_body and readable and (length is None or length <= self.buffer_limit):
            return await self._send_buffered()
        return await self._send_bytes()

    async def _send_translated(self) -> web.StreamResponse:
        """An answer in another format than the client's: read (whole, or event by event) and
        written in the client's. What the gateway cannot read, it cannot translate: a 502."""
        ex, upstream = self.ex, self.upstream
        assert ex.translation is not None
        ex.response_headers = {**(ex.response_headers or {}), **ex.translation.response_headers()}
        coded = bool(content_codings(upstream.headers))
        if upstream.status < 300 and upstream.content_type == "text/event-stream" and not coded:
            ex.outcome.stream_began()
            return await self._send_events()
        if upstream.status < 300 and ex.translation.ask.stream:
            upstream.close()  # a client reading a stream would take a whole answer for an empty stream
            return ex.error_response(
                502,
                "the upstream answered a streamed request with no stream the gateway can read",
                "upstream_bad_answer",
            )
        length = upstream.content_length
        if length is not None and length > self.buffer_limit:
            upstream.close()
            return ex.error_response(
                502, "the upstream's answer is too large to translate", "upstream_answer_too_large"
            )
        return await self._send_buffered()

    def _headers(self, filtered: CIMultiDict[str] | None = None) -> CIMultiDict[str]:
        """The client's response headers: the upstream's end-to-end ones (already filtered when
        given), plus the request id and the timing."""
        headers = filtered if filtered is not None else end_to_end(self.upstream.headers)
        if self.redactor is not None and (self.upstream.status >= 300 or _carries_link(headers)):
            redactor = self.redactor
            if any(redactor.found_in(name) or redactor.found_in(value) for name, value in headers.items()):
                # A value is redacted; a header whose name holds the credential is dropped.
                headers = CIMultiDict(
                    (name, redactor.text(value)) for name, value in headers.items() if not redactor.found_in(name)
                )
        if self.ex.response_headers:
            headers.update(self.ex.response_headers)
        headers[self.request_id_header] = self.ex.request_id
        headers["Server-Timing"] = self.ex.server_timing()
        return headers

    async def _send_buffered(self) -> web.StreamResponse:
        ex, upstream = self.ex, self.upstream
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := await upstream.readany():
                chunks.append(chunk)
                size += len(chunk)
                if ex.answer_limit is not None and size > ex.answer_limit.size:
                    upstream.close()
                    return ex.answer_limit.refusal(ex)
                if size > self.buffer_limit:
                    if ex.translation is not None:
                        upstream.close()
                        return ex.error_response(
                            502, "the upstream's answer is too large to translate", "upstream_answer_too_large"
                        )
                    if upstream.status >= 300 and self.redactor is not None and content_codings(upstream.headers):
                        return self._unredactable()
                    # Too large to hold: what was read goes first, the rest streams, hooks are skipped.
                    return await self._send_bytes(prefix=b"".join(chunks))
        except (TimeoutError, *_UPSTREAM_BROKE) as exc:
            upstream.close()
            ex.outcome.cut("upstream")
            stalled = isinstance(exc, TimeoutError)
            if ex.channel is not None:
                self._broke(ex.channel, "stream_stalled" if stalled else "stream_broken")
            message = "upstream stalled while sending its answer" if stalled else "upstream broke off its answer"
            # it had the request: the official SDKs must not send it again on their own
            return ex.error_response(
                504 if stalled else 502,
                message,
                "upstream_timeout" if stalled else "upstream_broke_off",
                headers={"x-should-retry": "false"},
            )
        ex.outcome.upstream_done(time.perf_counter())
        answer = UpstreamResponse(upstream.status, end_to_end(upstream.headers), b"".join(chunks))
        if ex.translation is not None:
            self._translate(answer)
        await self.pipeline.run_response(ex, answer)
        if ex.translation is not None and answer.status < 300:
            self._counted(ex.translation.usage())
        if answer.status >= 300 and self.redactor is not None:
            self._redact(answer)
        if ex.route.creates is not None and answer.status < 300 and ex.translation is None:
            # after the hooks: an id in another upstream's shape has been normalised by then
            body = answer.json()
            if await self.affinity.remember_from_body(ex, body):
                answer.set_json(body)  # it now carries the gateway's alias of the upstream's id
        response = web.Response(status=answer.status, body=answer.body, headers=self._headers(answer.headers))
        # Its head is written here, not after the handler returns, where a header aiohttp will
        # not write could no longer be answered with a clear 502.
        if not await self._prepare(response):
            return self._unwritable()
        ex.outcome.answered(answer.status, len(answer.body))
        return response

    async def _prepare(self, response: web.StreamResponse) -> bool:
        """Write the answer's head to the client; False when it cannot be written (a header
        aiohttp will not put on the wire), in which case nothing of it was sent."""
        try:
            await response.prepare(self.ex.request)
        except (ValueError, UnicodeError):
            return False
        return True

    def _unwritable(self) -> web.Response:
        """The client's answer in place of one whose head cannot be written: logged, and a 502."""
        log.error("the answer's head could not be written to the client", extra={"request_id": self.ex.request_id})
        return self.ex.error_response(
            502, "the upstream's answer could not be passed on: a header in it cannot be written"
        )

    def _translate(self, answer: UpstreamResponse) -> None:
        """A whole answer, success or error, in the client's format (an error's words with the
        credential taken out first: they are the upstream's)."""
        try:
            decoded = answer.decoded_body(self.buffer_limit)
        except AnswerTooLarge:
            decoded = None
        if decoded is not None and answer.status >= 300 and self.redactor is not None:
            decoded = self.redactor.bytes(decoded)
        translation = self.ex.translation
        assert translation is not None
        answer.status, translated = translation.answer(answer.status, decoded if decoded is not None else b"")
        answer.headers.popall("content-length", None)
        try:
            answer.set_json(translated)
        except jsonutil.JSONEncodeError:
            answer.status, translated = translation.unreadable()
            answer.set_json(translated)

    def _counted(self, found: Usage) -> None:
        """A translated answer's usage as the upstream counted it. The client's format may hold
        numbers where the upstream said none (a message's usage has no empty field): those are
        no count, and what the upstream left unsaid the gateway estimates."""
        usage = self.ex.usage
        usage.input_tokens, usage.output_tokens = found.input_tokens, found.output_tokens
        usage.cached_input_tokens, usage.reasoning_tokens = found.cached_input_tokens, found.reasoning_tokens
        usage.final = found.final

    def _translated_end(self, translating: StreamTranslation) -> None:
        """How a translated stream ended, told where a passed-through one's failure is: the
        request's error, and for a stream the upstream left unfinished, the channel's health."""
        fault = translating.fault
        if fault is None:
            return
        self.ex.outcome.failed(fault.message, fault.code)
        if translating.unfinished and self.ex.channel is not None:
            self.ex.outcome.cut("upstream")
            self._broke(self.ex.channel, "stream_broken")

    def _redact(self, answer: UpstreamResponse) -> None:
        """Take the credential out of a body that is not a success; one whose encoding cannot be
        undone here is replaced by an error of the gateway's own."""
        try:
            decoded = answer.decoded_body(self.buffer_limit)
        except AnswerTooLarge:
            decoded = None
        if decoded is None:
            answer.set_json(
                self.ex.format.error_payload(
                    answer.status if answer.status >= 400 else 502, f"upstream answered {answer.status}"
                )
            )
            return
        redacted = self.redactor.bytes(decoded)  # type: ignore[union-attr]
        if redacted != decoded or decoded is not answer.body:
            answer.body = redacted
            answer.headers.popall("content-encoding", None)

    def _broke(self, channel: Channel, kind: str) -> None:
        """The answer's head looked fine; its body's failure is the channel's all the same."""
        channel.health.record(True)
        self.observer.upstream_result(channel, kind)

    def _unredactable(self) -> web.Response:
        """An error answer too large to decode here: it cannot be checked, so it is not sent."""
        self.upstream.close()
        status = self.upstream.status
        return self.ex.error_response(
            status if status >= 400 else 502, f"upstream answered {status} with a compressed body too large to check"
        )

    async def _send_bytes(self, prefix: bytes = b"") -> web.StreamResponse:
        ex, upstream = self.ex, self.upstream
        scrub: StreamRedactor | None = None
        if upstream.status >= 300 and self.redactor is not None:
            scrub = self.redactor.stream()  # the length may change: the answer goes chunked
        response = DeferredEnd(status=upstream.status, headers=self._headers())
        response.content_length = upstream.content_length if scrub is None else None
        ex.outcome.answered(upstream.status)
        if not await self._prepare(response):
            upstream.close()
            return self._unwritable()
        response.watch = ReaderWatch(ex, self.client_idle_s)
        try:
            if response.content_length is None:  # chunked: its end is the last chunk, which aiohttp writes
                if prefix:
                    await self._write(response, prefix, scrub)
                while chunk := await upstream.readany():
                    await self._write(response, chunk, scrub)
                last = scrub.flush() if scrub is not None else b""
            else:  # its end is its last byte: the last chunk read waits to go with it
                last = prefix
                while chunk := await upstream.readany():
                    if last:
                        await self._write(response, last, None)
                    last = chunk
            ex.outcome.upstream_done(time.perf_counter())
            response.last = last
            ex.outcome.sent(len(last))
        except _CLIENT_GONE:
            return self._client_gone(response)
        except Exception as exc:
            if not isinstance(exc, (TimeoutError, *_UPSTREAM_BROKE)):
                log.exception("body relay failed", extra={"request_id": ex.request_id})
            ex.outcome.failed(f"upstream body broke off: {type(exc).__name__}")
            ex.outcome.cut("upstream" if isinstance(exc, (TimeoutError, *_UPSTREAM_BROKE)) else "gateway")
            upstream.close()
            # The client sees a short body on a closed connection: nothing can be appended.
            if ex.request.transport is not None:
                ex.request.transport.close()
            return response
        except BaseException:
            response.unwatch()
            raise
        return response

    async def _write(self, response: web.StreamResponse, chunk: bytes, scrub: StreamRedactor | None) -> None:
        if scrub is not None:
            chunk = scrub.feed(chunk)
        if chunk:
            await response.write(chunk)
            self.ex.outcome.sent(len(chunk))

    async def _send_events(self) -> web.StreamResponse:
        ex, upstream, pipeline = self.ex, self.upstream, self.pipeline
        headers = self._headers()
        headers.popall("content-length", None)
        headers.update(STREAM_HEADERS)
        response = DeferredEnd(status=upstream.status, headers=headers)
        ex.outcome.answered(upstream.status)
        if not await self._prepare(response):
            upstream.close()
            return self._unwritable()
        hooks = bool(pipeline.event_hooks)
        translating = self.translating = ex.translation.stream(self.buffer_limit) if ex.translation else None
        pin_pending = ex.route.creates is Pin.RESPONSE and upstream.status < 300 and translating is None
        # Unframed (nobody reads the events), a stream's bytes go on as they come and nothing is held.
        parser = SSEParser(self.max_event) if hooks or pin_pending or translating else None
        stream = StreamWatch(ex, self.observer)
        response.watch = ReaderWatch(ex, self.client_idle_s)
        if self.drain is not None:
            self.drain.opened(self)
        try:
            with ExitStack() as phases:  # the stream a phase, and each event hook one of its own, for the whole stream
                stream.spans = [phases.enter_context(phase(ex, "stream"))]
                stream.spans += [phases.enter_context(phase(ex, hook.phase)) for hook in pipeline.event_hooks]
                phases.callback(stream.tell_spans)  # (run first: before the spans end)
                return await self._relay_events(response, parser, hooks, pin_pending, stream)
        except BaseException:
            response.unwatch()
            raise
        finally:
            if self.drain is not None:
                self.drain.closed(self)
            if self.translating is not None:
                self._counted(self.translating.usage())
            stream.close()

    def cut(self, revoked: bool = False) -> None:
        """End this stream now, with its format's error event: the gateway is shutting down, or
        (`revoked`) the key it runs under was revoked (key_store.revoked_streams: end)."""
        self.was_cut = REVOKED if revoked else SHUTTING_DOWN
        self.upstream.close()  # the waiting read ends at once

    def key_name(self) -> str | None:
        return self.ex.key.name if self.ex.key is not None else None

    async def _end_cut(self, response: web.StreamResponse) -> None:
        self.ex.outcome.cut("gateway")
        if self.was_cut == REVOKED:
            await self._end_stream_with_error(response, 401, _REVOKED_MESSAGE, REVOKED)
        else:
            await self._end_stream_with_error(response, 503, _CUT_MESSAGE, SHUTTING_DOWN)

    async def _relay_events(
        self, response: DeferredEnd, parser: SSEParser | None, hooks: bool, pin_pending: bool, stream: StreamWatch
    ) -> web.StreamResponse:
        ex, upstream = self.ex, self.upstream
        try:
            while chunk := await upstream.readany():
                if parser is None:
                    await response.write(chunk)
                    ex.outcome.sent(len(chunk))
                    stream.wrote(0)
                    continue
                try:
                    events, too_large = parser.feed(chunk), None
                except EventTooLarge as refused:  # (not kept: its traceback holds the frames it came through)
                    events, too_large = refused.events, refused.limit
                pin_pending = await self._pass_on(response, events, hooks, pin_pending, stream)
                if too_large is not None:
                    await self._event_too_large(response, too_large)
                    return response
            if parser is not None:
                # The stream's end completes an event whose blank line ended in a CR (no LF will
                # follow): the hooks see it like any other, then the unended rest goes as it came.
                last, rest = parser.flush()
                if last:
                    await self._pass_on(response, last, hooks, pin_pending, stream)
                if self.translating is not None:  # the client's closing events (an unended rest is no event)
                    await self._pass_on(response, self.translating.end(), hooks, pin_pending, stream, translated=True)
                    self._translated_end(self.translating)
                elif rest:
                    await self._write_or_hold(response, rest)
        except Exception as exc:
            if isinstance(exc, _CLIENT_GONE) and not self.was_cut:  # (a cut upstream reads as a reset too)
                return self._client_gone(response)
            stopped = self.was_cut or isinstance(exc, (TimeoutError, *_UPSTREAM_BROKE))
            if parser is not None and parser.pending and stopped:
                await self._pass_on_stopped(response, parser, hooks, pin_pending, stream)
            # Headers are gone already: the client learns of the failure in the stream itself.
            await self._stream_failed(response, exc)
            return response
        if self.was_cut:  # the upstream's end raced the cut: the client is told all the same
            await self._end_cut(response)
            return response
        ex.outcome.upstream_done(time.perf_counter())
        return response  # its end is aiohttp's to write, after the bookkeeping

    async def _pass_on(
        self,
        response: DeferredEnd,
        events: list[SSEEvent],
        hooks: bool,
        pin_pending: bool,
        stream: StreamWatch,
        translated: bool = False,
    ) -> bool:
        """Run one read's events through the hooks and write them; whether the pin is still pending.
        The events before the one that brings the closing counts (or makes the answer whole) go at
        once, whatever came with them in the same read; from that one on they wait for the end.
        Events of another format are the client's first (`translated`: they are already)."""
        ex, pipeline = self.ex, self.pipeline
        if self.translating is not None and not translated:
            events = self.translating.feed(events)
        out: list[bytes] = []
        held_from = 0 if ex.usage.final or ex.outcome.whole else None
        for event in events:
            if pin_pending and await self.affinity.remember_from_event(ex, event):
                pin_pending = False
            if hooks:
                passed = pipeline.run_event(ex, event)
                if held_from is None and (ex.usage.final or ex.outcome.whole):
                    held_from = len(out)
                if passed is None:
                    continue
                event = passed
            out.append(event.raw)
        if out:
            written = len(out)
            if held_from:  # (not None, not 0) what came before the closing event: written now
                ex.outcome.sent(sum(map(len, out[:held_from])))
                await response.write(b"".join(out[:held_from]))
                del out[:held_from]
            if out:
                await self._write_or_hold(response, b"".join(out) if len(out) > 1 else out[0])
            stream.wrote(written)
        return pin_pending

    async def _pass_on_stopped(
        self, response: DeferredEnd, parser: SSEParser, hooks: bool, pin_pending: bool, stream: StreamWatch
    ) -> None:
        """The upstream stopped (broke off, stalled, or the drain cut it) just after a blank line
        ending in a CR: that event was whole, as a browser reading the upstream would have had it,
        so it goes on before the stream's error event. A failure here (a hook's, the client's
        write) leaves the stream's own failure to be told all the same."""
        try:
            await self._pass_on(response, parser.flush()[0], hooks, pin_pending, stream)
        except _CLIENT_GONE:
            pass  # (the error event's write finds the client gone too, and says so)
        except Exception:
            log.exception("stream relay failed on the last event", extra={"request_id": self.ex.request_id})

    async def _event_too_large(self, response: DeferredEnd, limit: int) -> None:
        """An event past the cap: the upstream's fault, told in the stream. Not the breaker's
        business (the channel answers other requests well; an image too large for the cap would
        take it out for everyone), but counted with the channel's failures."""
        ex = self.ex
        ex.outcome.cut("upstream")
        channel = ex.channel.name if ex.channel is not None else None
        log.warning(
            "upstream stream event over the cap: stream ended",
            extra={"request_id": ex.request_id, "channel": channel, "max_event_bytes": limit},
        )
        if ex.channel is not None:
            self.observer.upstream_result(ex.channel, "event_too_large")
        mb = limit / (1024 * 1024)
        await self._end_stream_with_error(
            response, 502, f"upstream sent a stream event over the {mb:g} MB limit", "upstream_event_too_large"
        )

    async def _write_or_hold(self, response: DeferredEnd, data: bytes) -> None:
        """Write a stream's events; once its closing counts are in, or its answer is whole and only
        they may follow (Outcome.answer_whole), hold the rest for its end (no more than a buffered
        answer may hold: an upstream that goes on past them is written on)."""
        ex = self.ex
        ex.outcome.sent(len(data))
        if (ex.usage.final or ex.outcome.whole) and len(response.last) + len(data) <= self.buffer_limit:
            response.last += data
            return
        if response.last:
            data, response.last = response.last + data, b""
        await response.write(data)

    async def _stream_failed(self, response: web.StreamResponse, exc: Exception) -> None:
        ex = self.ex
        if self.was_cut:  # the gateway ended it, not the upstream: no fault of the channel's
            await self._end_cut(response)
        elif isinstance(exc, TimeoutError):
            ex.outcome.cut("upstream")
            self._broke(ex.channel, "stream_stalled")  # type: ignore[arg-type]
            await self._end_stream_with_error(response, 504, "upstream stream stalled: no data within the idle timeout")
        elif isinstance(exc, _UPSTREAM_BROKE):
            ex.outcome.cut("upstream")
            self._broke(ex.channel, "stream_broken")  # type: ignore[arg-type]
            await self._end_stream_with_error(response, 502, "upstream closed the stream before it finished")
        else:
            ex.outcome.cut("gateway")
            log.exception("stream relay failed", extra={"request_id": ex.request_id})
            await self._end_stream_with_error(response, 500, "the gateway failed while relaying the stream")

    async def _end_stream_with_error(
        self, response: web.StreamResponse, status: int, message: str, code: str | None = None
    ) -> None:
        self.ex.outcome.failed(message, code)
        self.upstream.close()
        try:
            error = self.ex.format.stream_error(status, message, code)
            self.ex.outcome.sent(len(error))
            if isinstance(response, DeferredEnd) and response.last:  # after what was held, not before it
                response.last += error
                return
            await response.write(error)
        except _CLIENT_GONE:
            self.ex.outcome.client_gone()

    def _client_gone(self, response: web.StreamResponse) -> web.StreamResponse:
        self.ex.outcome.client_gone()
        self.upstream.close()  # stop the upstream's work at once; its connection is not reused
        return response


class DeferredEnd(web.StreamResponse):
    """An answer relayed as it comes (SSE or bytes), whose end aiohttp writes once the handler has
    returned: after the request's bookkeeping. `last`, the bytes that must not reach the client
    before then (an answer of known length is whole with its last byte, a stream with its closing
    counts), goes with the end; the watch on the client's reading lasts until it is written."""

    def __init__(self, *, status: int, headers: CIMultiDict[str]) -> None:
        super().__init__(status=status, headers=headers)
        self.last = b""
        self.watch: ReaderWatch | None = None

    async def write_eof(self, data: bytes = b"") -> None:
        last, self.last = self.last, b""
        try:
            await super().write_eof(last + data if data else last)
        finally:
            self.unwatch()

    def unwatch(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None


class StreamWatch:
    """What a stream did, for metrics and traces: its events, its first byte, its hook spans."""

    __slots__ = ("ex", "observer", "events", "first_byte_at", "spans")

    def __init__(self, ex: Exchange, observer: Observer) -> None:
        self.ex = ex
        self.observer = observer
        self.events = 0
        self.first_byte_at: float | None = None
        # The stream's phase and its event hooks': one span each for the whole stream (not one per
        # event) when traced, the stream's first.
        self.spans: list[Any] = []
        observer.stream_opened(ex)

    def wrote(self, events: int) -> None:
        self.events += events
        self.ex.outcome.events_sent(self.events)
        if self.first_byte_at is None:
            self.first_byte_at = time.perf_counter()

    def tell_spans(self) -> None:
        for span in self.spans:
            if span is not None:
                span.set_attribute("modelgate.events", self.events)
        if self.spans and self.spans[0] is not None and self.first_byte_at is not None:
            self.spans[0].set_attribute("modelgate.first_event_ms", (self.first_byte_at - self.ex.started) * 1000)

    def close(self) -> None:
        self.observer.stream_closed(self.ex, self.events, self.first_byte_at, time.perf_counter())


def _carries_link(headers: CIMultiDict[str]) -> bool:
    for name in _LINKS:
        if name in headers:
            return True
    return False
