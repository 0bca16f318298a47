"""The message format's answers in the translation's words: stop reasons, usage (cache reads and
writes beside the prompt), and its stream read and written, block by block."""

from __future__ import annotations

from typing import Any

from proxy.formats import MESSAGES
from proxy.formats.translation.codec import (
    StreamReader,
    StreamWriter,
    UnknownAnswer,
    call_id,
    event_data,
    made_by,
    read_fault,
    text,
    to_client,
    whole,
)
from proxy.formats.translation.ir import (
    END,
    FILTERED,
    MAX_TOKENS,
    REFUSAL,
    STOP_SEQUENCE,
    TOOL_USE,
    Ask,
    Begin,
    Counts,
    Delta,
    Failed,
    Finish,
    Piece,
)
from proxy.wire.sse import SSEEvent

STOPS = {
    "end_turn": END,
    "max_tokens": MAX_TOKENS,
    "tool_use": TOOL_USE,
    "stop_sequence": STOP_SEQUENCE,
    "refusal": REFUSAL,
    "pause_turn": END,
    "model_context_window_exceeded": MAX_TOKENS,
}


REASONS = {
    END: "end_turn",
    MAX_TOKENS: "max_tokens",
    TOOL_USE: "tool_use",
    STOP_SEQUENCE: "stop_sequence",
    REFUSAL: "refusal",
    FILTERED: "refusal",
}


def counts_of(usage: Any) -> Counts | None:
    if not isinstance(usage, dict):
        return None
    fresh, read, written = (
        whole(usage.get("input_tokens")),
        whole(usage.get("cache_read_input_tokens")),
        whole(usage.get("cache_creation_input_tokens")),
    )
    total = None if fresh is None else fresh + (read or 0) + (written or 0)
    return Counts(total, whole(usage.get("output_tokens")), read, written)


def usage_of(counts: Counts) -> dict[str, Any]:
    read, written = counts.cache_read or 0, counts.cache_write or 0
    return {
        "input_tokens": max(0, (counts.input or 0) - read - written),
        "output_tokens": counts.output or 0,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
    }


_KINDS = {"tool_use": "tool_call", "thinking": "thinking"}  # a block's type as the records name it


class MessageReader(StreamReader):
    def __init__(self) -> None:
        self.counts = Counts()
        self.stop = END
        self.stop_sequence: str | None = None

    def feed(self, event: SSEEvent) -> list[Piece]:
        data = event_data(event)
        if data is None:
            return []
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message") or {}
            self._count(message.get("usage"))
            return [Begin(text(message.get("id")), text(message.get("model")), self.counts)]
        if kind == "content_block_start":
            block, index = data.get("content_block") or {}, whole(data.get("index")) or 0
            block_kind = _KINDS.get(block.get("type"), "text")
            if block_kind == "tool_call":
                return [
                    Delta(
                        index, "tool_call", call_id=call_id(block.get("id")), name=text(block.get("name")), opens=True
                    )
                ]
            if block.get("type") == "redacted_thinking":
                return [Delta(index, "thinking", signature=None, text="")]
            opening = block.get("text") or block.get("thinking") or ""
            return [Delta(index, block_kind, opening)] if opening else []
        if kind == "content_block_delta":
            delta, index = data.get("delta") or {}, whole(data.get("index")) or 0
            found = delta.get("type")
            if found == "text_delta":
                return [Delta(index, "text", delta.get("text") or "")]
            if found == "thinking_delta":
                return [Delta(index, "thinking", delta.get("thinking") or "")]
            if found == "signature_delta":
                return [Delta(index, "thinking", signature=made_by("messages", delta.get("signature")))]
            if found == "input_json_delta":
                return [Delta(index, "tool_call", delta.get("partial_json") or "")] if delta.get("partial_json") else []
            return []
        if kind == "message_delta":
            delta = data.get("delta") or {}
            self.stop = STOPS.get(delta.get("stop_reason"), END)
            self.stop_sequence = delta.get("stop_sequence") if isinstance(delta.get("stop_sequence"), str) else None
            self._count(data.get("usage"))
            return []
        if kind == "message_stop":
            return [Finish(self.stop, self.stop_sequence, self.counts)]
        if kind == "error":
            return [Failed(read_fault(502, data))]
        return []

    def _count(self, usage: Any) -> None:
        found = counts_of(usage)
        if found is None:
            return
        if isinstance(usage, dict) and "input_tokens" in usage:
            self.counts.input, self.counts.cache_read, self.counts.cache_write = (
                found.input,
                found.cache_read,
                found.cache_write,
            )
        if found.output is not None:
            self.counts.output = found.output


class MessageWriter(StreamWriter):
    format = MESSAGES

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self.open: tuple[int, str] | None = None  # the block open now: its index and kind (an upstream's
        # delta of another kind than its block's opens one of that kind: never a write of one kind into another)
        self.index = -1  # the client's index of it
        self.kind = ""
        self.counts = Counts()

    def feed(self, piece: Piece) -> list[SSEEvent]:
        if isinstance(piece, Begin):
            self.counts = piece.counts or Counts()
            message = {
                "id": piece.id,
                "type": "message",
                "role": "assistant",
                "model": piece.model or self.ask.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage_of(self.counts), "output_tokens": 0},
            }
            return [_event("message_start", {"type": "message_start", "message": message})]
        if isinstance(piece, Delta):
            out = []
            if (piece.index, piece.kind) != self.open:
                if piece.kind == "tool_call" and not piece.opens:  # (interleaved with another, or opened never)
                    raise UnknownAnswer("arguments of a call not open")
                out += self._close()
                out.append(self._start(piece))
                if piece.opens:
                    return out
            out += self._delta(piece)
            return out
        if isinstance(piece, Finish):
            counts = piece.counts or self.counts
            delta = {"stop_reason": REASONS[piece.stop], "stop_sequence": piece.stop_sequence}
            return [
                *self._close(),
                _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_of(counts)}),
                _event("message_stop", {"type": "message_stop"}),
            ]
        if isinstance(piece, Failed):
            return self.failed(piece.fault)
        return []

    def _start(self, piece: Delta) -> SSEEvent:
        self.open, self.index, self.kind = (piece.index, piece.kind), self.index + 1, piece.kind
        block: dict[str, Any] = {"type": "text", "text": ""}
        if piece.kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        elif piece.kind == "tool_call":
            block = {"type": "tool_use", "id": piece.call_id, "name": piece.name, "input": {}}
        return _event(
            "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
        )

    def _delta(self, piece: Delta) -> list[SSEEvent]:
        if piece.kind == "text" and piece.text:
            delta = {"type": "text_delta", "text": piece.text}
        elif piece.kind == "thinking" and piece.signature:
            delta = {"type": "signature_delta", "signature": to_client(piece.signature)}
        elif piece.kind == "thinking" and piece.text:
            delta = {"type": "thinking_delta", "thinking": piece.text}
        elif piece.kind == "tool_call" and piece.text:
            delta = {"type": "input_json_delta", "partial_json": piece.text}
        else:
            return []
        return [_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})]

    def _close(self) -> list[SSEEvent]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]


def _event(name: str, data: dict[str, Any]) -> SSEEvent:
    return SSEEvent.build(data, name)
