"""SSE passthrough: streams are framed event by event, and usage is read from the events that carry it.

Framing is what lets every other plugin see streams per event; the per-event cost here
is one substring test, and a JSON parse only for the one or two events with usage. A stream
whose format tells its usage only on request (chat completions) is asked for it, and the
chunk that answers is read and kept from a client that did not ask; the finish of its last
choice goes with that chunk, so the whole answer is never the client's before its counts are in.
"""

from __future__ import annotations

from proxy.config import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.core.plugin import Joins, Plugin
from proxy.wire.sse import SSEEvent

_LOOKED_FOR_ID = 3  # the events that may name the answer: the first few
_UNASKED = "usage_unasked"  # the stream's usage was asked for by the gateway, not the client
_CLIENTS = "clients_stream_options"  # what the client sent there, before the gateway asked
_ABSENT = object()  # (it sent none)
_FINISHED = "finished_choices"  # the choices of a stream whose finish came


class SSEPassthrough(Plugin):
    name = "sse"
    provides = frozenset({"stream usage"})
    joins = Joins(usage=True, metered=True)  # the endpoints, and a stored response's stream resumed
    order = 600
    before_owner_check = True  # its on_request reads the body alone, nothing a followed id holds

    def configure(self, config: GatewayConfig) -> None:
        if all(channel.stream_usage for channel in config.channels):
            self.idle("on_upstream")  # every upstream is asked: nothing to undo per channel

    def on_request(self, ex: Exchange) -> None:  # never waits: no coroutine
        """A stream that would not be told its usage (the chat-completions format's, unless the
        request asks) is asked for it upstream: its tokens are charged like any other's."""
        if not ex.streaming:
            return
        body = ex.json()
        if (asking := ex.format.with_stream_usage(body)) is not None:
            state = ex.state(self)
            state[_CLIENTS] = body.get("stream_options", _ABSENT)  # what the gateway's question replaced
            ex.set_json(asking)
            state[_UNASKED] = True

    def on_upstream(self, ex: Exchange) -> None:  # never waits: no coroutine
        """A channel whose upstream does not take the question (`stream_usage: false`) is sent
        the client's `stream_options` back, in the body as this attempt has it (the channel's
        model name, other hooks' changes); the next channel tried is asked again (the forwarder
        puts the body back before each attempt)."""
        state = ex.state(self)
        if _CLIENTS not in state:
            return
        asks = ex.channel is None or ex.channel.config.stream_usage
        if not asks:
            body = dict(ex.json())
            if (clients := state[_CLIENTS]) is _ABSENT:
                body.pop("stream_options", None)
            else:
                body["stream_options"] = clients
            ex.set_json(body)
        state[_UNASKED] = asks

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if finished := ex.format.finished_choices(event, ex.json()):  # a chat stream's, before its usage
            done = ex.state(self).setdefault(_FINISHED, set())
            done.update(finished)
            if len(done) >= ex.format.outputs(ex.json()):
                ex.outcome.answer_whole()
        usage = ex.format.usage_from_event(event)
        if usage is not None and ex.state(self).get(_UNASKED) and ex.format.unasked_usage(event):
            ex.usage.update(usage)  # read, and kept from the client, who did not ask for it
            return None
        # The opening events name the answer (parsed for their usage already); a ping may come first.
        if not ex.outcome.response_id and ex.outcome.events < _LOOKED_FOR_ID:
            ex.outcome.identified(ex.format.response_id_of(event.json()))
        if usage is not None:
            if ex.route.creates is not None or ex.route.follows is None:  # a resumed stream costs nothing itself
                ex.usage.update(usage)
            if usage.final and (generation := ex.format.generation_in_event(event)) is not None:
                ex.generation = generation
        return event
