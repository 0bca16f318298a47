"""Response-format requests (spec 2.13, 7.4, 8), endpoint 11."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from proxy.schemas.common import AnyObject, Model, tagged, text_or
from proxy.schemas.enums import UPSTREAMS, open_enum, open_tagged


class InputText(Model):
    type: Literal["input_text"]
    text: str


class InputImage(Model):
    type: Literal["input_image"]
    detail: open_enum("input[].content[].detail", ("high", "low", "auto"), UPSTREAMS) | None = None
    file_id: str | None = None
    image_url: str | None = None


class InputFile(Model):
    type: Literal["input_file"]
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


ContentPart = tagged({"input_text": InputText, "input_image": InputImage, "input_file": InputFile}, other=AnyObject)


class MessageItem(Model):
    type: Literal["message"] | None = None
    role: open_enum("input[].role", ("user", "assistant", "system", "developer"), UPSTREAMS)
    content: text_or(list[ContentPart])  # type: ignore[valid-type]


class FunctionCallOutput(Model):
    type: Literal["function_call_output"]
    call_id: str
    # The interface names a string; the openai SDK also sends a list of content parts (a tool that
    # returns an image or a file), which its upstream takes: refusing it would break that client.
    output: text_or(list[ContentPart])  # type: ignore[valid-type]
    id: str | None = None
    status: open_enum("input[].status", ("in_progress", "completed", "incomplete"), UPSTREAMS) | None = None


class ComputerCallOutput(Model):
    type: Literal["computer_call_output"]
    call_id: str
    output: dict[str, Any]
    acknowledged_safety_checks: list[Any] | None = None
    id: str | None = None
    status: str | None = None


class ItemReference(Model):
    type: Literal["item_reference"] | None = None
    id: str


class SummaryText(Model):
    type: open_enum("input[].summary[].type", ("summary_text",), UPSTREAMS)
    text: str


class ReasoningItem(Model):
    type: Literal["reasoning"]
    id: str
    summary: list[SummaryText]
    encrypted_content: str | None = None
    status: str | None = None


def _item_kind(value: Any) -> str:
    if not isinstance(value, dict):
        return "\u00a7"
    kind = value.get("type")
    if kind is None:
        kind = "message" if "role" in value else "item_reference" if "id" in value else ""
    return "\u00a7" + str(kind)


# Items a client echoes back from earlier output (function_call, message output ...) pass.
InputItem = tagged(
    {
        "message": MessageItem,
        "input_text": InputText,
        "input_image": InputImage,
        "input_file": InputFile,
        "function_call_output": FunctionCallOutput,
        "computer_call_output": ComputerCallOutput,
        "item_reference": ItemReference,
        "reasoning": ReasoningItem,
    },
    pick=_item_kind,
    other=AnyObject,
)


class RankingOptions(Model):
    ranker: str | None = None
    score_threshold: float | None = Field(default=None, ge=0, le=1)


class FileSearchTool(Model):
    type: Literal["file_search"]
    vector_store_ids: list[str]
    max_num_results: int | None = Field(default=None, ge=1, le=50)
    filters: dict[str, Any] | None = None
    ranking_options: RankingOptions | None = None


class FunctionTool(Model):
    type: Literal["function"]
    name: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class UserLocation(Model):
    type: open_enum("tools[].user_location.type", ("approximate",), UPSTREAMS)
    city: str | None = None
    country: str | None = Field(default=None, pattern=r"^[A-Za-z]{2}$")
    region: str | None = None
    timezone: str | None = None


class WebSearchTool(Model):
    type: Literal["web_search_preview", "web_search_preview_2025_03_11"]
    search_context_size: open_enum("tools[].search_context_size", ("low", "medium", "high"), UPSTREAMS) | None = None
    user_location: UserLocation | None = None
    domains: list[str] | None = None


class ComputerUseTool(Model):
    type: Literal["computer_use_preview"]
    display_height: int = Field(ge=1)
    display_width: int = Field(ge=1)
    environment: str


Tool = tagged(
    {
        "file_search": FileSearchTool,
        "function": FunctionTool,
        "web_search_preview": WebSearchTool,
        "web_search_preview_2025_03_11": WebSearchTool,
        "computer_use_preview": ComputerUseTool,
    },
    other=AnyObject,
)


class HostedToolChoice(Model):
    type: Literal["file_search", "web_search_preview", "computer_use_preview"]


class FunctionToolChoice(Model):
    type: Literal["function"]
    name: str = Field(min_length=1)


ToolChoice = open_tagged(
    {
        "file_search": HostedToolChoice,
        "web_search_preview": HostedToolChoice,
        "computer_use_preview": HostedToolChoice,
        "function": FunctionToolChoice,
    },
    "OtherResponseToolChoice",
    "tool_choice.type",
    UPSTREAMS,
)
ToolChoiceWord = open_enum("tool_choice", ("none", "auto", "required"), UPSTREAMS)


class TextFormatText(Model):
    type: Literal["text"]


class TextFormatJsonSchema(Model):
    type: Literal["json_schema"]
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextFormatJsonObject(Model):
    type: Literal["json_object"]


class TextOptions(Model):
    format: (
        open_tagged(
            {
                "text": TextFormatText,
                "json_schema": TextFormatJsonSchema,  # type: ignore[valid-type]
                "json_object": TextFormatJsonObject,
            },
            "OtherTextFormat",
            "text.format.type",
            UPSTREAMS,
        )
        | None
    ) = None


class Reasoning(Model):
    # Output limits and charges go by the tokens the upstream reports, not by the effort asked for.
    effort: open_enum("reasoning.effort", ("low", "medium", "high"), UPSTREAMS) | None = None
    summary: open_enum("reasoning.summary", ("auto", "concise", "detailed"), UPSTREAMS) | None = None
    generate_summary: open_enum("reasoning.generate_summary", ("auto", "concise", "detailed"), UPSTREAMS) | None = None


INCLUDES = (
    "file_search_call.results",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "reasoning.encrypted_content",
)


class ResponseRequest(Model):
    model: str = Field(min_length=1)
    # Optional as in the SDK's own type: a stored prompt, a conversation or a previous response
    # can be the whole of what the model reads; with none of them it is required (below).
    input: text_or(list[InputItem]) | None = None  # type: ignore[valid-type]
    include: list[open_enum("include[]", INCLUDES, UPSTREAMS)] | None = None  # type: ignore[valid-type]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    # Closed: a tier changes what the upstream bills (priority and fast cost more than default),
    # and the price table prices tokens at one rate, so a tier nobody has looked at must not pass
    # unseen. The list is the interface's and the openai SDK's (ServiceTier), and tracks the SDK.
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    store: bool | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: TextOptions | None = None
    tool_choice: text_or(ToolChoice, ToolChoiceWord) | None = None  # type: ignore[valid-type]
    tools: list[Tool] | None = None  # type: ignore[valid-type]
    top_p: float | None = Field(default=None, ge=0, le=1)
    truncation: open_enum("truncation", ("disabled", "auto"), UPSTREAMS) | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _something_to_read(self) -> ResponseRequest:
        extra = self.model_extra or {}
        if (
            self.input is None
            and self.previous_response_id is None
            and extra.get("prompt") is None
            and extra.get("conversation") is None
        ):
            raise ValueError("input: is required (unless prompt, conversation or previous_response_id gives it)")
        return self

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > 16:
            raise ValueError("at most 16 key-value pairs")
        for key, item in value.items():
            if len(key) > 64:
                raise ValueError(f"key {key[:20]!r}... is longer than 64 characters")
            if len(item) > 512:
                raise ValueError(f"the value of {key!r} is longer than 512 characters")
        return value
