"""The chat-completions format (`POST /v1/chat/completions`): Bearer, usage in the body, and in a
stream's closing chunk only when the request asks for it (`stream_options.include_usage`).

A stream that does not ask would cost its caller nothing the gateway could see, so the gateway
asks for it on the caller's behalf (`with_stream_usage`) and keeps the chunk that answers it out
of the caller's stream (`unasked_usage`): every token a key causes is charged, and a client
gets exactly the stream it asked for. The finish of its last choice (`finished_choices`) goes with
the usage chunk, at the stream's end: a client cannot see the answer whole and leave first.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.core import jsonutil
from proxy.formats.base import Format, KeyLocation, Usage, token_count
from proxy.formats.counts import asked_count
from proxy.wire.sse import SSEEvent

# The closing chunk's usage object, however the upstream spaces its JSON; the other chunks carry
# `"usage":null` or none. A search in C, so most chunks cost no parse.
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
# A choice's finish. The others carry null, or (sglang, Ollama, some providers) "" on every
# content chunk, or even "null": none of those is a finish.
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"[^"]')


class ChatFormat(Format):
    name = "chat"
    reports_usage = True
    key_location = KeyLocation.BEARER
    # The upstream reads `max_completion_tokens`; `max_tokens` is its older name, still read.
    output_field = (("max_completion_tokens",), ("max_tokens",))
    asking_less = "a lower max_completion_tokens (and no larger limit under another name)"
    # Given twice, an upstream reading the first could stream with no usage while the gateway
    # read it asking for some (or read no stream at all).
    charged_by = (b'"stream"', b'"stream_options"', b'"include_usage"')

    def outputs(self, body: Any) -> int:
        """`n` choices, each up to the output limit."""
        return asked_count(body, "n") or 1

    def usage_from_body(self, body: Any) -> Usage | None:
        """`prompt_tokens` counts the whole prompt (its cached part among it) and
        `completion_tokens` all that was generated (its reasoning among it): the gateway's terms."""
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        return Usage(
            token_count(usage, "prompt_tokens"),
            token_count(usage, "completion_tokens"),
            token_count(usage.get("prompt_tokens_details"), "cached_tokens"),
            token_count(usage.get("completion_tokens_details"), "reasoning_tokens"),
            final=True,
        )

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if _USAGE.search(event.raw) is None:
            return None
        return self.usage_from_body(event.json())

    def with_stream_usage(self, body: Any) -> Any:
        """The body of a streamed request that does not ask for its usage, asking for it; None
        when it asks already (or is no streamed request)."""
        if not isinstance(body, dict) or body.get("stream") is not True:
            return None
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            return None
        return {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}

    def finished_choices(self, event: SSEEvent, body: Any) -> tuple[int, ...]:
        """The choices this chunk finishes, by index: where the request (`body`, as sent) asks for
        the usage chunk that follows the finishes; without it there are no counts to wait for."""
        if _FINISH.search(event.raw) is None or not _asks_usage(body):
            return ()
        data = event.json()
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list):
            return ()
        return tuple(
            c["index"] if isinstance(c.get("index"), int) else 0
            for c in choices
            if isinstance(c, dict) and _finish(c.get("finish_reason"))
        )

    def unasked_usage(self, event: SSEEvent) -> bool:
        """Whether this event is the usage chunk `with_stream_usage` asked for: no choices, and usage."""
        if _USAGE.search(event.raw) is None:
            return False
        data = event.json()
        return isinstance(data, dict) and data.get("choices") == [] and isinstance(data.get("usage"), dict)

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        # An unnamed event holding `error`, as the upstream sends one: the openai SDK raises an
        # APIError with its message.
        return b"data: " + jsonutil.dumps(self.error_payload(status, message, code)) + b"\n\n"


def _finish(reason: Any) -> bool:
    return isinstance(reason, str) and reason not in ("", "null")


def _asks_usage(body: Any) -> bool:
    options = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True
