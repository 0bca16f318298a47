"""The response format's answers in the translation's words: output items, status, usage, and its
stream read and written, event by numbered event."""

from __future__ import annotations

import time
from typing import Any

from proxy.formats import RESPONSES
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
    whole,
)
from proxy.formats.translation.ir import (
    END,
    FILTERED,
    MAX_TOKENS,
    REFUSAL,
    TOOL_USE,
    Ask,
    Begin,
    Counts,
    Delta,
    Failed,
    Fault,
    Finish,
    Part,
    Piece,
)
from proxy.wire.sse import SSEEvent


def output_parts(output: Any) -> list[Part]:
    parts = []
    for item in output or []:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            for piece in item.get("content") or []:
                if isinstance(piece, dict) and piece.get("type") == "output_text":
                    parts.append(Part("text", piece.get("text") or ""))
                elif isinstance(piece, dict) and piece.get("type") == "refusal":
                    parts.append(Part("text", piece.get("refusal") or "", name="refusal"))
        elif kind == "function_call":
            parts.append(
                Part(
                    "tool_call",
                    call_id=call_id(item.get("call_id")),
                    name=text(item.get("name")),
                    arguments=item.get("arguments") or "",
                )
            )
        elif kind == "reasoning":
            said = "".join(s.get("text") or "" for s in item.get("summary") or [] if isinstance(s, dict))
            said = said or "".join(s.get("text") or "" for s in item.get("content") or [] if isinstance(s, dict))
            if said:
                parts.append(Part("thinking", said))
    return parts


def stop_of(body: Any, parts: list[Part]) -> str:
    details = body.get("incomplete_details") if isinstance(body, dict) else None
    reason = details.get("reason") if isinstance(details, dict) else None
    if reason == "max_output_tokens":
        return MAX_TOKENS
    if reason == "content_filter":
        return FILTERED
    if any(p.kind == "text" and p.name == "refusal" for p in parts):
        return REFUSAL
    if any(p.kind == "tool_call" for p in parts):
        return TOOL_USE
    return END


def response_object(
    ident: str,
    model: str,
    created: int,
    output: list[dict[str, Any]],
    stop: str | None,
    counts: Counts | None,
    ask: Ask,
) -> dict[str, Any]:
    """A response as the format shows it; `stop` None: still in progress."""
    status = "in_progress" if stop is None else "incomplete" if stop in (MAX_TOKENS, FILTERED) else "completed"
    reason = {MAX_TOKENS: "max_output_tokens", FILTERED: "content_filter"}.get(stop or "")
    return {
        "id": ident,
        "object": "response",
        "created_at": created or int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
        "instructions": None,
        "max_output_tokens": ask.max_output,
        "model": model,
        "output": output,
        "parallel_tool_calls": ask.parallel_tools is not False,
        "previous_response_id": None,
        "reasoning": {"effort": ask.effort, "summary": None},
        "store": False,
        "temperature": ask.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": ask.top_p,
        "truncation": "disabled",
        "usage": usage_of(counts) if counts is not None else None,
        "metadata": {},
    }


def response_id(upstream_id: str) -> str:
    """A response's id from the upstream's answer's: the format's `resp_` prefix, whole or streamed."""
    return upstream_id if upstream_id.startswith("resp_") else f"resp_{upstream_id}"


def counts_of(usage: Any) -> Counts | None:
    return named_counts(usage, "input", "output")


def usage_of(counts: Counts) -> dict[str, Any]:
    return named_usage(counts, "input", "output")


class ResponseReader(StreamReader):
    def __init__(self) -> None:
        self.called = False

    def feed(self, event: SSEEvent) -> list[Piece]:
        data = event_data(event)
        if data is None:
            return []
        kind = data.get("type") or event.name
        index = whole(data.get("output_index")) or 0
        if kind == "response.created":
            response = data.get("response") or {}
            return [Begin(text(response.get("id")), text(response.get("model")))]
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                self.called = True
                opened = Delta(
                    index, "tool_call", call_id=call_id(item.get("call_id")), name=text(item.get("name")), opens=True
                )
                return [opened, Delta(index, "tool_call", item["arguments"])] if item.get("arguments") else [opened]
            return []
        if kind == "response.output_text.delta":
            return [Delta(index, "text", data.get("delta") or "")] if data.get("delta") else []
        if kind == "response.refusal.delta":
            return [Delta(index, "text", data.get("delta") or "")] if data.get("delta") else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [Delta(index, "thinking", data.get("delta") or "")] if data.get("delta") else []
        if kind == "response.function_call_arguments.delta":
            return [Delta(index, "tool_call", data.get("delta") or "")] if data.get("delta") else []
        if kind in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            parts = output_parts(response.get("output"))
            return [Finish(stop_of(response, parts), counts=counts_of(response.get("usage")))]
        if kind == "response.failed":
            response = data.get("response") or {}
            return [Failed(read_fault(502, response))]
        if kind == "error":
            message = data.get("message") if isinstance(data.get("message"), str) else None
            return [Failed(Fault(502, message, data.get("code")) if message else read_fault(502, data))]
        return []


class ResponseWriter(StreamWriter):
    """The format's events, numbered, around each output item: a reasoning item for thinking, a
    message for text, a function call per tool call; the closing event carries the whole response."""

    format = RESPONSES

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self.id = ""
        self.model = ask.model
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # the output so far
        self.said: list[str] = []  # what the open item said so far, in its pieces
        self.open: tuple[int, str] | None = None  # the block whose item is open, by index and kind (a delta
        # of another kind than its block's opens an item of that kind)
        self.kind = ""

    def _event(self, kind: str, **fields: Any) -> SSEEvent:
        event = SSEEvent.build({"type": kind, "sequence_number": self.sequence, **fields}, kind)
        self.sequence += 1
        return event

    def _response(self, stop: str | None, counts: Counts | None) -> dict[str, Any]:
        return response_object(self.id, self.model, self.created, self.items if stop else [], stop, counts, self.ask)

    def feed(self, piece: Piece) -> list[SSEEvent]:
        if isinstance(piece, Begin):
            self.id = response_id(piece.id)
            self.model = piece.model or self.model
            response = self._response(None, None)
            return [
                self._event("response.created", response=response),
                self._event("response.in_progress", response=response),
            ]
        if isinstance(piece, Delta):
            out = []
            if (piece.index, piece.kind) != self.open:
                if piece.kind == "tool_call" and not piece.opens:  # (interleaved with another, or opened never)
                    raise UnknownAnswer("arguments of a call not open")
                out += self._close()
                out += self._open(piece)
            out += self._delta(piece)
            return out
        if isinstance(piece, Finish):
            out = self._close()
            kind = "response.completed" if piece.stop not in (MAX_TOKENS, FILTERED) else "response.incomplete"
            return [*out, self._event(kind, response=self._response(piece.stop, piece.counts))]
        if isinstance(piece, Failed):
            return self.failed(piece.fault)
        return []

    def _open(self, piece: Delta) -> list[SSEEvent]:
        self.open, self.kind = (piece.index, piece.kind), piece.kind
        n = len(self.items)
        if piece.kind == "tool_call":
            item = {
                "type": "function_call",
                "id": f"fc_{self.id}_{n}",
                "call_id": piece.call_id,
                "name": piece.name,
                "arguments": "",
                "status": "in_progress",
            }
            self.items.append(item)
            return [self._event("response.output_item.added", output_index=n, item=dict(item))]
        if piece.kind == "thinking":
            item = {"type": "reasoning", "id": f"rs_{self.id}_{n}", "summary": []}
            self.items.append(item)
            part = {"type": "summary_text", "text": ""}
            item["summary"].append(part)
            return [
                self._event("response.output_item.added", output_index=n, item={**item, "summary": []}),
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    part=dict(part),
                ),
            ]
        item = {
            "type": "message",
            "id": f"msg_{self.id}_{n}",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.items.append(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        return [
            self._event("response.output_item.added", output_index=n, item={**item, "content": []}),
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=n, content_index=0, part=dict(part)
            ),
        ]

    def _delta(self, piece: Delta) -> list[SSEEvent]:
        n = len(self.items) - 1
        item = self.items[n]
        if piece.kind == "tool_call" and piece.text:
            self.hold(piece.text)
            self.said.append(piece.text)
            return [
                self._event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=piece.text
                )
            ]
        if piece.kind == "thinking" and piece.text:
            self.hold(piece.text)
            self.said.append(piece.text)
            return [
                self._event(
                    "response.reasoning_summary_text.delta",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    delta=piece.text,
                )
            ]
        if piece.kind == "text" and piece.text:
            self.hold(piece.text)
            self.said.append(piece.text)
            return [
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    delta=piece.text,
                    logprobs=[],
                )
            ]
        return []

    def _close(self) -> list[SSEEvent]:
        if self.open is None:
            return []
        self.open = None
        n = len(self.items) - 1
        item = self.items[n]
        said, self.said = "".join(self.said), []  # (joined once: appending to a string copies it whole)
        if item["type"] == "function_call":
            item["arguments"] = said
        elif item["type"] == "reasoning":
            item["summary"][0]["text"] = said
        else:
            item["content"][0]["text"] = said
        out = []
        if item["type"] == "function_call":
            item["status"] = "completed"
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=n,
                    arguments=item["arguments"],
                )
            )
        elif item["type"] == "reasoning":
            part = item["summary"][0]
            out.append(
                self._event(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    text=part["text"],
                )
            )
            out.append(
                self._event(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    part=dict(part),
                )
            )
        else:
            item["status"] = "completed"
            part = item["content"][0]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=dict(part)
                )
            )
        out.append(self._event("response.output_item.done", output_index=n, item=item))
        return out
