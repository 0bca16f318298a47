"""Chat-completions requests (`POST /v1/chat/completions`), as the openai SDK's types describe them.

What the gateway decides by is checked closely (the model, the counts a reservation goes by, the
service tier it bills at); the enumerations an upstream alone acts on are open, so next month's
values (a new role, a new content part, a new reasoning effort) pass to the upstream, which is
the authority on them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from proxy.schemas.common import AnyObject, Model, tagged, text_or
from proxy.schemas.enums import UPSTREAMS, open_enum, open_tagged


class TextPart(Model):
    type: Literal["text"]
    text: str


class ImageUrl(Model):
    url: str = Field(min_length=1)
    detail: (
        open_enum("messages[].content[].image_url.detail", ("auto", "low", "high", "original"), UPSTREAMS) | None
    ) = None


class ImagePart(Model):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(Model):
    data: str
    format: open_enum("messages[].content[].input_audio.format", ("wav", "mp3"), UPSTREAMS)


class AudioPart(Model):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FilePart(Model):
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(Model):
    type: Literal["refusal"]
    refusal: str


ContentPart = tagged(
    {"text": TextPart, "image_url": ImagePart, "input_audio": AudioPart, "file": FilePart, "refusal": RefusalPart},
    other=AnyObject,
)


class FunctionCall(Model):
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Model):
    id: str = Field(min_length=1)
    type: open_enum("messages[].tool_calls[].type", ("function", "custom"), UPSTREAMS)
    function: FunctionCall | None = None


class ChatMessage(Model):
    role: open_enum("messages[].role", ("system", "developer", "user", "assistant", "tool", "function"), UPSTREAMS)
    # Optional: an assistant turn that only calls tools has none (null, or no field).
    content: text_or(list[ContentPart]) | None = None  # type: ignore[valid-type]
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(Model):
    name: str = Field(min_length=1)  # what an upstream accepts as a name is its own rule
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(Model):
    type: Literal["function"]
    function: FunctionDefinition


Tool = tagged({"function": FunctionTool}, other=AnyObject)


class NamedFunction(Model):
    name: str = Field(min_length=1)


class FunctionToolChoice(Model):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = open_tagged({"function": FunctionToolChoice}, "OtherChatToolChoice", "tool_choice.type", UPSTREAMS)
ToolChoiceWord = open_enum("tool_choice", ("none", "auto", "required"), UPSTREAMS)


class JsonSchemaFormat(Model):
    name: str = Field(min_length=1)  # as a tool's name: the upstream's rule
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormatJsonSchema(Model):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class ResponseFormatPlain(Model):
    type: Literal["text", "json_object"]


ResponseFormat = open_tagged(
    {"json_schema": ResponseFormatJsonSchema, "text": ResponseFormatPlain, "json_object": ResponseFormatPlain},
    "OtherChatResponseFormat",
    "response_format.type",
    UPSTREAMS,
)


class StreamOptions(Model):
    include_usage: bool | None = None


class ChatCompletionRequest(Model):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    # Counts a reservation goes by (the upstream reads the first, and the second as its older name).
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    reasoning_effort: (
        open_enum("reasoning_effort", ("none", "minimal", "low", "medium", "high", "xhigh", "max"), UPSTREAMS) | None
    ) = None
    response_format: ResponseFormat | None = None  # type: ignore[valid-type]
    seed: int | None = None
    # Closed, as on the response format (and the same list): a tier changes what the upstream bills.
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    stop: text_or(list[str]) | None = None  # type: ignore[valid-type]  (how many: the upstream's rule)
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    tool_choice: text_or(ToolChoice, ToolChoiceWord) | None = None  # type: ignore[valid-type]
    tools: list[Tool] | None = None  # type: ignore[valid-type]
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    top_p: float | None = Field(default=None, ge=0, le=1)
    user: str | None = None
