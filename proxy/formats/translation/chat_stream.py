"""The chat-completions format's answers in the translation's words: stop reasons, usage, and its
stream read (chunks to pieces) and written."""

from __future__ import annotations

import time
from typing import Any

from proxy.formats import CHAT
from proxy.formats.translation.codec import (
    StreamReader,
    StreamWriter,
    UnknownAnswer,
    call_id,
    event_data,
    named_counts,
    named_usage,
    read_fault,
    text,
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
    "stop": END,
    "length": MAX_TOKENS,
    "tool_calls": TOOL_USE,
    "function_call": TOOL_USE,
    "content_filter": FILTERED,
}


FINISHES = {
    END: "stop",
    STOP_SEQUENCE: "stop",
    MAX_TOKENS: "length",
    TOOL_USE: "tool_calls",
    FILTERED: "content_filter",
    REFUSAL: "content_filter",
}


def counts_of(usage: Any) -> Counts | None:
    return named_counts(usage, "prompt", "completion")


def usage_of(counts: Counts) -> dict[str, Any]:
    return named_usage(counts, "prompt", "completion")


class ChatReader(StreamReader):
    """Chunks to pieces. The finish comes before the usage chunk, so it is told at the end."""

    def __init__(self) -> None:
        self.begun = False
        self.text_block: int | None = None
        self.thinking_block: int | None = None
        self.calls: dict[int, int] = {}  # the upstream's tool-call index -> the block it opened
        self.blocks = 0
        self.stop: str | None = None
        self.counts: Counts | None = None

    def _block(self) -> int:
        self.blocks += 1
        return self.blocks - 1

    def feed(self, event: SSEEvent) -> list[Piece]:
        if event.data is not None and event.data.strip() == "[DONE]":
            return []
        chunk = event_data(event)
        if chunk is None:
            return []
        if "error" in chunk and "choices" not in chunk:
            return [Failed(read_fault(502, chunk))]
        out: list[Piece] = []
        if not self.begun:
            self.begun = True
            out.append(Begin(text(chunk.get("id")), text(chunk.get("model"))))
        if isinstance(chunk.get("usage"), dict):
            self.counts = counts_of(chunk["usage"])
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if choice is None:
            return out
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str) and thought:
            if self.thinking_block is None:
                self.thinking_block = self._block()
            out.append(Delta(self.thinking_block, "thinking", thought))
        if isinstance(delta.get("content"), str) and delta["content"]:
            if self.text_block is None:
                self.text_block = self._block()
            out.append(Delta(self.text_block, "text", delta["content"]))
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            index = call.get("index") if isinstance(call.get("index"), int) else len(self.calls)
            block = self.calls.get(index)
            if block is None:
                block = self.calls[index] = self._block()
                out.append(
                    Delta(
                        block, "tool_call", call_id=call_id(call.get("id")), name=text(function.get("name")), opens=True
                    )
                )
            if isinstance(function.get("arguments"), str) and function["arguments"]:
                out.append(Delta(block, "tool_call", function["arguments"]))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason not in ("", "null"):
            self.stop = STOPS.get(reason, END)
        return out

    def end(self) -> list[Piece]:
        if self.stop is None:
            return []  # no finish came: the stream broke off (the relay tells the client so)
        if self.stop == END and self.calls:
            self.stop = TOOL_USE  # a forced function's answer says "stop" (as vLLM's named tool choice does)
        return [Finish(self.stop, counts=self.counts)]


class ChatWriter(StreamWriter):
    format = CHAT

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self.id = ""
        self.model = ask.model
        self.created = int(time.time())
        self.calls: dict[int, int] = {}  # block -> the tool-call index the client sees

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
        return SSEEvent.build(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
        )

    def feed(self, piece: Piece) -> list[SSEEvent]:
        if isinstance(piece, Begin):
            self.id = piece.id
            self.model = piece.model or self.model
            return [self._chunk({"role": "assistant", "content": ""})]
        if isinstance(piece, Delta):
            if piece.kind == "text":
                return [self._chunk({"content": piece.text})]
            if piece.kind == "thinking":
                return [self._chunk({"reasoning_content": piece.text})] if piece.text else []
            if piece.opens:
                index = self.calls[piece.index] = len(self.calls)
                call = {
                    "index": index,
                    "id": piece.call_id,
                    "type": "function",
                    "function": {"name": piece.name, "arguments": ""},
                }
                return [self._chunk({"tool_calls": [call]})]
            index = self.calls.get(piece.index)
            if index is None:  # (a call's arguments before its opening: no call to give them to)
                raise UnknownAnswer("arguments of a call not open")
            return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece.text}}]})]
        if isinstance(piece, Finish):
            out = [self._chunk({}, FINISHES[piece.stop])]
            if self.ask.stream_usage and piece.counts is not None:
                out.append(
                    SSEEvent.build(
                        {
                            "id": self.id,
                            "object": "chat.completion.chunk",
                            "created": self.created,
                            "model": self.model,
                            "choices": [],
                            "usage": usage_of(piece.counts),
                        }
                    )
                )
            out.append(SSEEvent(b"data: [DONE]\n\n"))
            return out
        if isinstance(piece, Failed):
            return self.failed(piece.fault)
        return []
