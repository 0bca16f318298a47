"""What a chat request, answer and stream say, in no format's words: the middle every translation
goes through (format A's reader, then format B's writer), so four formats need four readers and
four writers, not twelve translators.

The records hold only what can be carried between formats. What one format's reader meets that
the others cannot express is refused by it (`Untranslatable`, a 400 naming the field) or, where
the spec of a translation says so, dropped and named in `dropped` (the client is told in a header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.core import jsonutil

# Why an answer stopped, in the translation's words (each format's own are mapped to and from these).
END, MAX_TOKENS, TOOL_USE, STOP_SEQUENCE, REFUSAL, FILTERED = (
    "end",
    "max_tokens",
    "tool_use",
    "stop_sequence",
    "refusal",
    "filtered",
)
# Reasoning effort and a thinking budget in tokens, one from the other: formats that take a level
# (response, chat completions) and formats that take a budget (message, content generation).
EFFORT_BUDGET = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576, "xhigh": 32768, "max": 65536}


class Untranslatable(ValueError):
    """A request field the upstream's format has no way to carry: a 400 naming it."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param}: {why}")
        self.param = param


@dataclass(slots=True)
class Part:
    """One piece of a turn: text, an image, thinking, a tool call, or a tool's result."""

    kind: str  # text | image | thinking | tool_call | tool_result
    text: str = ""
    media_type: str | None = None  # an image's, when its data is inline
    data: str | None = None  # an image's Base64; a redacted thinking block's opaque data
    url: str | None = None  # an image's URL
    call_id: str | None = None  # a tool call's id, and the id its result answers
    name: str | None = None  # the tool called
    arguments: str = ""  # a tool call's arguments, as JSON text
    content: list[Part] | None = None  # a tool result's text and images
    is_error: bool = False  # a tool result reporting a failure
    signature: str | None = None  # thinking's signature, which the upstream that made it checks
    cache: dict[str, Any] | None = None  # a prompt-cache hint on it (cache_control)


@dataclass(slots=True)
class Turn:
    role: str  # user | assistant
    parts: list[Part]


@dataclass(slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: Any = None  # a JSON schema
    cache: dict[str, Any] | None = None
    strict: bool | None = None  # its arguments held to the schema exactly (None: the format's default)


@dataclass(slots=True)
class Ask:
    """A chat request."""

    model: str
    turns: list[Turn]
    system: list[Part] = field(default_factory=list)
    stream: bool = False
    max_output: int | None = None
    assumed_output: int = 4096  # the limit written where a format requires one and the client named none
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | None = None  # auto | none | required | named
    tool_named: str | None = None
    parallel_tools: bool | None = None
    json_schema: dict[str, Any] | None = None  # {"name", "schema", "strict"}
    json_object: bool = False
    thinking_budget: int | None = None  # tokens; 0: thinking off
    effort: str | None = None
    stream_usage: bool = True  # a chat-completions stream asks for its counts
    user: str | None = None
    # What was left out, and the client is told so: in order, each once (a set with an order).
    dropped: dict[str, None] = field(default_factory=dict)


@dataclass(slots=True)
class Counts:
    """An answer's usage: `input` the whole prompt, its cache reads and writes among it;
    `output` all that was generated, its reasoning among it."""

    input: int | None = None
    output: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    reasoning: int | None = None


@dataclass(slots=True)
class Reply:
    """A whole answer."""

    id: str
    model: str
    parts: list[Part]
    stop: str = END
    stop_sequence: str | None = None
    counts: Counts | None = None
    created: int = 0


@dataclass(slots=True)
class Fault:
    """An upstream's error, in no format's words."""

    status: int
    message: str
    code: str | None = None


# -- a stream, as deltas: what a reader makes of the upstream's events, what a writer writes --


@dataclass(slots=True)
class Begin:
    id: str
    model: str
    counts: Counts | None = None  # the prompt's, where the upstream says it first


@dataclass(slots=True)
class Delta:
    """More of block `index` of the answer: text, thinking (or its signature), or a tool call's
    arguments; a tool call's block opens with its id and name."""

    index: int
    kind: str  # text | thinking | tool_call
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    signature: str | None = None
    opens: bool = False  # a tool call's block opens: its id and name, no arguments yet


@dataclass(slots=True)
class Finish:
    stop: str
    stop_sequence: str | None = None
    counts: Counts | None = None


@dataclass(slots=True)
class Failed:
    fault: Fault


Piece = Begin | Delta | Finish | Failed


def json_text(value: Any) -> str:
    """Tool arguments as JSON text, from an object (or text already)."""
    return value if isinstance(value, str) else jsonutil.dumps(value if value is not None else {}).decode()


def parsed_arguments(text: str) -> dict[str, Any]:
    """A tool call's arguments as the object the message and content formats carry; text that
    is no JSON object (a model's broken output) is kept whole under `_raw`, never made up."""
    if not text:
        return {}
    value = jsonutil.parsed(text.encode())
    return value if isinstance(value, dict) else {"_raw": text}
