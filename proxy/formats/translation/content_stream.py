"""The content-generation format's answers in the translation's words: finish reasons, usage
(thoughts beside the candidates), parts, and its stream read and written."""

from __future__ import annotations

import re
import secrets
from typing import Any

from proxy.formats import CONTENT
from proxy.formats.translation.codec import (
    StreamReader,
    StreamWriter,
    UnknownAnswer,
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
    Part,
    Piece,
    json_text,
    parsed_arguments,
)
from proxy.wire.sse import SSEEvent

STOPS = {"STOP": END, "MAX_TOKENS": MAX_TOKENS}


_BLOCKED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


REASONS = {
    END: "STOP",
    STOP_SEQUENCE: "STOP",
    TOOL_USE: "STOP",
    MAX_TOKENS: "MAX_TOKENS",
    FILTERED: "SAFETY",
    REFUSAL: "SAFETY",
}


SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def get(mapping: Any, name: str) -> Any:
    """A field by its JSON name, else its proto name."""
    if not isinstance(mapping, dict):
        return None
    found = mapping.get(name)
    return found if found is not None else mapping.get(SNAKE.sub("_", name).lower())


def answer_parts(part: Any) -> list[Part]:
    """What one part of an answer holds: its text (or thought), and a function call beside it."""
    if not isinstance(part, dict):
        return []
    found = []
    if isinstance(part.get("text"), str):
        if part.get("thought") is True:
            found.append(Part("thinking", part["text"], signature=made_by("content", get(part, "thoughtSignature"))))
        else:
            found.append(Part("text", part["text"]))
    call = get(part, "functionCall")
    if isinstance(call, dict):
        # A call the upstream gave no id gets one of its own: a client keys its calls by id, and
        # meets them again in later turns (where its result is matched to the call by tool name).
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        found.append(
            Part(
                "tool_call",
                call_id=call_id or f"call_{secrets.token_hex(8)}",
                name=text(call.get("name")),
                arguments=json_text(call.get("args")),
                signature=made_by("content", get(part, "thoughtSignature")),
            )
        )
    return found


def blocked(body: Any) -> bool:
    """Whether an answer says the prompt itself was refused (`promptFeedback.blockReason`)."""
    feedback = get(body, "promptFeedback")
    return isinstance(feedback, dict) and bool(get(feedback, "blockReason"))


def stop_of(reason: Any, parts: list[Part]) -> str:
    if reason in _BLOCKED:
        return FILTERED
    if any(p.kind == "tool_call" for p in parts) and reason in (None, "STOP"):
        return TOOL_USE
    return STOPS.get(reason, END)


def counts_of(meta: Any) -> Counts | None:
    if not isinstance(meta, dict):
        return None
    output = whole(get(meta, "candidatesTokenCount"))
    thoughts = whole(get(meta, "thoughtsTokenCount"))
    if thoughts is not None:
        output = (output or 0) + thoughts
    return Counts(
        whole(get(meta, "promptTokenCount")), output, whole(get(meta, "cachedContentTokenCount")), None, thoughts
    )


def usage_of(counts: Counts) -> dict[str, Any]:
    reasoning = counts.reasoning or 0
    answer = max(0, (counts.output or 0) - reasoning)
    meta = {
        "promptTokenCount": counts.input or 0,
        "candidatesTokenCount": answer,
        "totalTokenCount": (counts.input or 0) + (counts.output or 0),
    }
    if counts.cache_read:
        meta["cachedContentTokenCount"] = counts.cache_read
    if reasoning:
        meta["thoughtsTokenCount"] = reasoning
    return meta


class ContentReader(StreamReader):
    """Each chunk holds whole parts: text and thoughts go as they come; a function call comes
    whole, so it opens and fills its block at once."""

    def __init__(self) -> None:
        self.begun = False
        self.blocks = 0
        self.text_block: int | None = None
        self.thinking_block: int | None = None
        self.stop: str | None = None
        self.counts: Counts | None = None
        self.called = False

    def feed(self, event: SSEEvent) -> list[Piece]:
        chunk = event_data(event)
        if chunk is None:
            return []
        if "error" in chunk and "candidates" not in chunk:
            return [Failed(read_fault(502, chunk))]
        out: list[Piece] = []
        counts = counts_of(get(chunk, "usageMetadata"))
        if counts is not None:
            self.counts = counts
        if not self.begun:
            self.begun = True
            out.append(Begin(str(get(chunk, "responseId") or ""), str(get(chunk, "modelVersion") or ""), counts))
        if blocked(chunk):  # the prompt was refused: the stream ends here, with no candidate
            self.stop = FILTERED
            return out
        candidates = chunk.get("candidates")
        candidate = (
            candidates[0] if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) else {}
        )
        for found in (p for part in get(candidate.get("content"), "parts") or [] for p in answer_parts(part)):
            if found.kind == "tool_call":
                self.called = True
                block = self._block()
                self.text_block = self.thinking_block = None
                out.append(Delta(block, "tool_call", call_id=found.call_id, name=found.name, opens=True))
                out.append(Delta(block, "tool_call", found.arguments))
            elif found.kind == "thinking":
                if self.thinking_block is None:
                    self.thinking_block = self._block()
                if found.text:
                    out.append(Delta(self.thinking_block, "thinking", found.text))
                if found.signature:
                    out.append(Delta(self.thinking_block, "thinking", signature=found.signature))
            elif found.text:
                if self.text_block is None:
                    self.text_block = self._block()
                    self.thinking_block = None
                out.append(Delta(self.text_block, "text", found.text))
        reason = get(candidate, "finishReason")
        if isinstance(reason, str) and reason:
            self.stop = stop_of(reason, [Part("tool_call")] if self.called else [])
        return out

    def _block(self) -> int:
        self.blocks += 1
        return self.blocks - 1

    def end(self) -> list[Piece]:
        if self.stop is None:
            return []
        return [Finish(self.stop, counts=self.counts)]


class ContentWriter(StreamWriter):
    """A chunk per piece of text; a tool call's arguments are held until its block ends, since
    the format sends a call whole."""

    format = CONTENT

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self.id = ""
        self.model = ask.model
        self.call: dict[str, Any] | None = None
        self.call_block: int | None = None

    def _chunk(self, parts: list[dict[str, Any]], finish: str | None = None, counts: Counts | None = None) -> SSEEvent:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": self.model, "responseId": self.id}
        if counts is not None:
            chunk["usageMetadata"] = usage_of(counts)
        return SSEEvent.build(chunk)

    def _flush_call(self) -> list[SSEEvent]:
        if self.call is None:
            return []
        call, self.call, self.call_block = self.call, None, None
        call["args"] = parsed_arguments("".join(call.pop("arguments")))
        return [self._chunk([{"functionCall": call}])]

    def feed(self, piece: Piece) -> list[SSEEvent]:
        if isinstance(piece, Begin):
            self.id, self.model = piece.id, piece.model or self.model
            return []
        if isinstance(piece, Delta):
            if piece.kind == "tool_call":
                if piece.opens:
                    out = self._flush_call()
                    self.call = {"id": piece.call_id, "name": piece.name, "arguments": []}  # (its pieces)
                    self.call_block = piece.index
                    return out
                if self.call is None or piece.index != self.call_block:
                    raise UnknownAnswer("arguments of a call not open")  # (interleaved or orphan: no whole call)
                self.hold(piece.text)
                self.call["arguments"].append(piece.text)
                return []
            out = self._flush_call()
            if piece.kind == "thinking":
                part: dict[str, Any] = {"text": piece.text, "thought": True}
                if piece.signature:
                    part["thoughtSignature"] = to_client(piece.signature)
                return out + [self._chunk([part])] if piece.text or piece.signature else out
            return out + [self._chunk([{"text": piece.text}])] if piece.text else out
        if isinstance(piece, Finish):
            return [*self._flush_call(), self._chunk([], REASONS[piece.stop], piece.counts or Counts(0, 0))]
        if isinstance(piece, Failed):
            return self.failed(piece.fault)
        return []
