"""Message-format requests (spec 2.9, 4 rule 4, 8, 9), endpoint 8."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from proxy.schemas.common import AnyObject, Model, tagged, text_or
from proxy.schemas.enums import UPSTREAMS, open_enum, open_tagged


class CacheControl(Model):
    type: open_enum("cache_control.type", ("ephemeral",), UPSTREAMS)


class TextBlock(Model):
    # Closed: where it is no member of a tagged union (`system`), a text block is all 2.9 allows.
    type: Literal["text"]
    text: str = Field(min_length=1)
    cache_control: CacheControl | None = None


class Base64Source(Model):
    type: Literal["base64"]
    media_type: open_enum(
        "messages[].content[].source.media_type",  # type: ignore[valid-type]
        ("image/jpeg", "image/png", "image/gif", "image/webp"),
        UPSTREAMS,
    )
    data: str


class UrlSource(Model):
    """An image the upstream fetches itself (the SDK's URLImageSourceParam): the gateway never does."""

    type: Literal["url"]
    url: str = Field(min_length=1)


class FileSource(Model):
    """An image uploaded to the upstream's file store before (the SDK's FileImageSourceParam)."""

    type: Literal["file"]
    file_id: str = Field(min_length=1)


ImageSource = open_tagged(
    {"base64": Base64Source, "url": UrlSource, "file": FileSource},
    "OtherImageSource",
    "messages[].content[].source.type",
    UPSTREAMS,
)


class ImageBlock(Model):
    type: Literal["image"]
    source: ImageSource  # type: ignore[valid-type]
    cache_control: CacheControl | None = None


class ToolUseBlock(Model):
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


# Known parts are checked; newer ones (documents, search results ...) pass, noted.
ResultPart = open_tagged(
    {"text": TextBlock, "image": ImageBlock}, "OtherResultPart", "messages[].content[].content[].type", UPSTREAMS
)


class ToolResultBlock(Model):
    type: Literal["tool_result"]
    tool_use_id: str
    content: text_or(list[ResultPart]) | None = None  # type: ignore[valid-type]  # optional, as the SDK types it
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class DocumentBlock(Model):
    type: Literal["document"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None


# Known block types are checked; newer ones (thinking, search results ...) pass to the upstream.
Block = tagged(
    {
        "text": TextBlock,
        "image": ImageBlock,
        "tool_use": ToolUseBlock,
        "tool_result": ToolResultBlock,
        "document": DocumentBlock,
    },
    other=AnyObject,
)


class Message(Model):
    # Open: 4 rule 4's check (tool results in user messages) needs only to know `assistant`.
    role: open_enum("messages[].role", ("user", "assistant"), UPSTREAMS)
    content: text_or(list[Block])  # type: ignore[valid-type]


class Metadata(Model):
    user_id: str | None = Field(default=None, max_length=256)


class ThinkingEnabled(Model):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)


class ThinkingDisabled(Model):
    type: Literal["disabled"]


class ToolChoiceAuto(Model):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Model):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Model):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Model):
    type: Literal["none"]


class CustomTool(Model):
    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class ComputerTool(Model):
    type: Literal["computer_20241022"]
    name: open_enum("tools[].name", ("computer",), UPSTREAMS)
    display_width_px: int = Field(ge=1)
    display_height_px: int = Field(ge=1)
    display_number: int | None = Field(default=None, ge=0)


class BashTool(Model):
    type: Literal["bash_20241022"]
    name: open_enum("tools[].name", ("bash",), UPSTREAMS)


class TextEditorTool(Model):
    type: Literal["text_editor_20241022"]
    name: open_enum("tools[].name", ("str_replace_editor",), UPSTREAMS)


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return "\u00a7" + ("custom" if kind is None else str(kind))


Tool = tagged(
    {
        "custom": CustomTool,
        "computer_20241022": ComputerTool,
        "bash_20241022": BashTool,
        "text_editor_20241022": TextEditorTool,
    },
    pick=_tool_kind,
    other=AnyObject,
)


class MessageRequest(Model):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: text_or(list[TextBlock]) | None = None  # type: ignore[valid-type]
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    # Known thinking types are checked; newer ones ("adaptive" ...) pass to the upstream, as blocks do.
    thinking: (
        tagged(
            {"enabled": ThinkingEnabled, "disabled": ThinkingDisabled},  # type: ignore[valid-type]
            other=AnyObject,
        )
        | None
    ) = None
    tool_choice: (
        open_tagged(
            {
                "auto": ToolChoiceAuto,
                "any": ToolChoiceAny,
                "tool": ToolChoiceTool,  # type: ignore[valid-type]
                "none": ToolChoiceNone,
            },
            "OtherMessageToolChoice",
            "tool_choice.type",
            UPSTREAMS,
        )
        | None
    ) = None
    tools: list[Tool] | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> MessageRequest:
        # With interleaved thinking the budget is the whole turn's, tool calls included: it may pass max_tokens.
        interleaved = "interleaved-thinking" in getattr(info.context, "betas", "")
        if (
            isinstance(self.thinking, ThinkingEnabled)
            and self.thinking.budget_tokens >= self.max_tokens
            and not interleaved
        ):
            raise ValueError(
                "thinking.budget_tokens: must be less than max_tokens (unless the interleaved-thinking "
                "beta is asked for)"
            )
        for index, message in enumerate(self.messages):
            if message.role == "assistant" and isinstance(message.content, list):
                for at, block in enumerate(message.content):
                    if isinstance(block, ToolResultBlock):
                        raise ValueError(f"messages[{index}].content[{at}]: tool results go back in a user message")
        return self
