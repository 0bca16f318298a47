"""What a simulated model says next in a conversation with tools, the same in every chat format.

Each format reads its request into a `Conversation` (the tools offered, the caller's tool choice,
the tools called earlier, the tool results the last input carries, a schema the answer must
follow); `next_call` then picks the tool to call, or none, and `answer_pieces` makes the text.
The rule an agent loop needs: a tool is called when tools are offered, and once the last input
carries a tool's result the answer is text that quotes it, so the loop ends. A caller that
requires a tool gets one it has not called yet (the framework's "final result" tool, typically).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.core import jsonutil
from simulator.core import words
from simulator.schema_values import value_for

_QUOTED = 1000  # characters of one tool result quoted back: enough to recognise, bounded


@dataclass(slots=True)
class Offered:
    """A tool the caller offers: its name and the schema of its arguments (any dialect)."""

    name: str
    schema: Any = None


@dataclass(slots=True)
class Conversation:
    tools: list[Offered] = field(default_factory=list)
    choice: str = "auto"  # auto | none | required
    named: str | None = None  # the one tool the caller forces
    allowed: set[str] | None = None  # the names the caller lets the model call
    called: list[str] = field(default_factory=list)  # tools called earlier in the conversation
    results: list[str] = field(default_factory=list)  # the tool results the last input carries
    schema: Any = None  # a JSON answer's schema (True: any JSON object)


def next_call(conversation: Conversation) -> Offered | None:
    """The tool to call now, or None for a text answer."""
    tools = [t for t in conversation.tools if conversation.allowed is None or t.name in conversation.allowed]
    if not tools or conversation.choice == "none":
        return None
    if conversation.named is not None:
        return next((t for t in tools if t.name == conversation.named), None)
    if not conversation.results:
        return tools[0]
    if conversation.choice != "required":
        return None  # the tool answered: the model answers the user
    fresh = [t for t in tools if t.name not in conversation.called]
    return fresh[0] if fresh else tools[-1]


def arguments(tool: Offered) -> dict[str, Any]:
    """Arguments that validate against the tool's schema (an object, as every format wants)."""
    args = value_for(tool.schema) if isinstance(tool.schema, dict) else {}
    return args if isinstance(args, dict) else {}


def answer_pieces(conversation: Conversation, output_tokens: int, lead: list[str] | None = None) -> list[str]:
    """The answer's text as the pieces it streams in (joined, the whole text; one token each):
    JSON for a schema, a sentence quoting the tool results, or `output_tokens` plain words."""
    if conversation.schema is not None:
        value = value_for(conversation.schema) if isinstance(conversation.schema, dict) else {"answer": "simulated"}
        text = jsonutil.dumps(value).decode()
        return [text[i : i + 8] for i in range(0, len(text), 8)] or ["{}"]
    if conversation.results:
        quoted = "; ".join(result[:_QUOTED] for result in conversation.results)
        spoken = (lead or []) + ["The", "tool", "returned:"] + quoted.split(" ")
    else:
        spoken = (lead or []) + words(max(0, output_tokens - len(lead or [])))
    return [word if i == 0 else " " + word for i, word in enumerate(spoken)]


def result_text(value: Any) -> str:
    """A tool result, whatever shape the format carries it in, as text to quote."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content blocks or items: their text
        texts = [b.get("text") for b in value if isinstance(b, dict) and isinstance(b.get("text"), str)]
        return " ".join(texts) if texts else jsonutil.dumps(value).decode()
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return next(iter(value.values()))  # {"result": "..."}, {"return_value": "..."}: the value itself
    return jsonutil.dumps(value).decode() if value is not None else ""
