"""What each chat format's translator provides: a reader and a writer for requests, answers,
errors and streams, all pure (no I/O), so a translation is one format's reader then another's
writer (proxy/formats/translation/__init__.py)."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from proxy.formats.base import Format
from proxy.formats.translation.ir import EFFORT_BUDGET, Ask, Counts, Fault, Part, Piece, Reply, Untranslatable
from proxy.wire.sse import SSEEvent

Query = Sequence[tuple[str, str | None]]  # a request's query pairs (None: a name without `=`)
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)(?:;[\w=.-]+)*;base64,(.*)", re.S)


class UnknownAnswer(Exception):
    """An upstream's success of no shape its format has: a 502, never an empty answer."""


class StreamReader:
    """Turns an upstream's stream events into pieces; `end` at the stream's end."""

    def feed(self, event: SSEEvent) -> list[Piece]:
        raise NotImplementedError

    def end(self) -> list[Piece]:
        return []


class TooLarge(UnknownAnswer):
    """More of an answer than a writer may hold until its part ends."""


class StreamWriter:
    """Turns pieces into the client's stream events, in its `format`."""

    format: ClassVar[Format]
    # What a writer may hold until a part of the answer ends (a response client's whole output,
    # which its closing event repeats; a content client's tool call, which goes whole): the
    # relay's buffer limit (`server.max_json_body_mb`), set by the stream's translation.
    limit = 64 * 1024 * 1024
    held = 0

    def feed(self, piece: Piece) -> list[SSEEvent]:
        raise NotImplementedError

    def failed(self, fault: Fault) -> list[SSEEvent]:
        """The client's error event: its stream ends with it."""
        return [SSEEvent(self.format.stream_error(fault.status, fault.message, fault.code))]

    def hold(self, text: str) -> None:
        """Count what the writer keeps; past `limit`, TooLarge."""
        self.held += len(text)
        if self.held > self.limit:
            raise TooLarge("more of an answer than the gateway holds to translate it")


class Codec:
    """One chat format, read and written."""

    format: ClassVar[Format]
    reading: ClassVar[Callable[[], StreamReader]]
    writing: ClassVar[Callable[[Ask], StreamWriter]]

    def read_ask(self, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
        """The client's request (`path_model`: the model its path names; `query`: its query pairs)."""
        raise NotImplementedError

    def write_ask(self, ask: Ask) -> dict[str, Any]:
        raise NotImplementedError

    def upstream_path(self, ask: Ask) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The path (before a channel's version) and query a request of this format goes to."""
        raise NotImplementedError

    def read_reply(self, body: Any) -> Reply:
        raise NotImplementedError

    def write_reply(self, reply: Reply, ask: Ask) -> dict[str, Any]:
        raise NotImplementedError

    def reader(self) -> StreamReader:
        """A state machine reading one stream of the format's (an upstream's)."""
        return self.reading()

    def writer(self, ask: Ask) -> StreamWriter:
        """A state machine writing one stream of the format's (a client's), answering `ask`."""
        return self.writing(ask)

    def write_fault(self, fault: Fault) -> dict[str, Any]:
        return self.format.error_payload(fault.status, fault.message, fault.code)


def read_fault(status: int, body: Any) -> Fault:
    """Any format's error body (`{error: {message, type | code | status}}`, the message format's
    `{type: error, error: {...}}`), or none readable: the status alone."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code") if isinstance(error.get("code"), str) else None
        code = code or next((error[k] for k in ("type", "status") if isinstance(error.get(k), str)), None)
        if isinstance(message, str) and message:
            return Fault(status, message, code)
    elif isinstance(error, str) and error:
        return Fault(status, error)
    return Fault(status, f"upstream answered {status}")


def data_url(url: str) -> tuple[str, str] | None:
    """The media type and Base64 data of a `data:` URL, or None for any other URL."""
    found = _DATA_URL.fullmatch(url) if url.startswith("data:") else None
    return (found[1], found[2]) if found else None


def text_of(value: Any, param: str) -> str:
    """Text given as a string or a list of text parts (`{type: text, text}` and its peers)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise Untranslatable(f"{param}[{i}]", "only text can be carried here to the upstream's format")
            texts.append(text)
        return "".join(texts)
    raise Untranslatable(param, "must be text")


def instructions(parts: list[Part], where: str) -> list[Part]:
    """A system prompt's parts: text only, as every format holds its instructions."""
    for part in parts:
        if part.kind != "text":
            raise Untranslatable(where, f"only text instructions can be translated, not {part.kind}")
    return parts


def text(value: Any) -> str:
    """A string an answer should hold where it holds something else (an id of 5): none."""
    return value if isinstance(value, str) else ""


# A signature (of thinking, of a call) binds to the upstream that made it: the translation's
# records carry it as "<format>.<signature>" (Base64 has no dot). A client of another format is
# given that as Base64 (what every format's client takes a signature to be) and sends it back as
# it was, so only an upstream of the format that made it gets it again.
_SIGNERS = frozenset({"messages", "content", "responses", "chat"})
_WRAPPED = "modelgate-signature:"


def to_client(signature: str | None) -> str | None:
    """A signature in the records as a client of another format than its maker's is given it."""
    return base64.b64encode((_WRAPPED + signature).encode()).decode() if signature else None


def made_by(fmt: str, signature: Any) -> str | None:
    """An upstream's signature in its answer, as the records carry it."""
    return f"{fmt}.{signature}" if isinstance(signature, str) and signature else None


def sent_back(fmt: str, signature: Any) -> str | None:
    """A signature in a client's request: one the gateway gave it (naming its format), or the
    client's own format's."""
    if not isinstance(signature, str) or not signature:
        return None
    try:
        given = base64.b64decode(signature, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        given = ""
    if given.startswith(_WRAPPED):
        inner = given[len(_WRAPPED) :]
        head, dot, _ = inner.partition(".")
        if dot and head in _SIGNERS:
            return inner
    return f"{fmt}.{signature}"


def own_signature(fmt: str, signature: str | None) -> str | None:
    """A signature as an upstream of `fmt` takes it: only one that format made."""
    prefix = f"{fmt}."
    return signature[len(prefix) :] if signature and signature.startswith(prefix) else None


def event_data(event: SSEEvent) -> dict[str, Any] | None:
    """A stream event's JSON object; None for one that carries no data (a ping, a comment).
    Data that is no JSON object is an answer the gateway cannot read (UnknownAnswer): a stream
    that skipped it would end as if whole, without what it said."""
    if not event.data or not event.data.strip():
        return None
    data = event.json()
    if not isinstance(data, dict):
        raise UnknownAnswer("an event whose data is no JSON object")
    return data


def named_counts(usage: Any, prompt: str, output: str) -> Counts | None:
    """Usage as the chat-completions and response formats say it, under their names for the
    prompt and the output (`<name>_tokens`, and `<name>_tokens_details` with its cached and its
    reasoning part): both count those parts among the whole, as the records do."""
    if not isinstance(usage, dict):
        return None
    inputs = usage.get(f"{prompt}_tokens_details") or {}
    outputs = usage.get(f"{output}_tokens_details") or {}
    return Counts(
        whole(usage.get(f"{prompt}_tokens")),
        whole(usage.get(f"{output}_tokens")),
        whole(inputs.get("cached_tokens")),
        None,
        whole(outputs.get("reasoning_tokens")),
    )


def named_usage(counts: Counts, prompt: str, output: str) -> dict[str, Any]:
    """The same, written."""
    inputs, outputs = counts.input or 0, counts.output or 0
    return {
        f"{prompt}_tokens": inputs,
        f"{prompt}_tokens_details": {"cached_tokens": counts.cache_read or 0},
        f"{output}_tokens": outputs,
        f"{output}_tokens_details": {"reasoning_tokens": counts.reasoning or 0},
        "total_tokens": inputs + outputs,
    }


def call_id(value: Any) -> str:
    """A tool call's id from an upstream's answer; one of the gateway's where it gave none (or
    not a string): a client keys its calls by id."""
    return value if isinstance(value, str) and value else f"call_{secrets.token_hex(8)}"


def number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def whole(value: Any) -> int | None:
    """A whole number, also as a float that is one (a JSON encoder may write `5.0`)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def strings(value: Any) -> list[str]:
    """A stop sequence or a list of them."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def effort_for(budget: int | None) -> str | None:
    """The reasoning level nearest a thinking budget."""
    if budget is None:
        return None
    if budget == 0:
        return "none"
    return min(EFFORT_BUDGET, key=lambda level: abs(EFFORT_BUDGET[level] - budget))
