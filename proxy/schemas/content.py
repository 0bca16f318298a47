"""Content-generation requests (spec 2.8, 2.11, 4 rule 1, 7.3, 8), endpoints 9 and 10.

Fields are checked under both spellings the spec shows (camelCase and snake_case).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, model_validator

from proxy.schemas import common
from proxy.schemas.enums import UPSTREAMS, open_enum


def field(camel: str, default: Any = None, **rules: Any) -> Any:
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()
    return Field(default=default, validation_alias=AliasChoices(camel, snake), serialization_alias=camel, **rules)


class Model(common.Model):
    """A content-generation object: a field the spec shows in two spellings is taken in either,
    never both. Given both, one would be checked and the other forwarded unchecked (an upstream
    may read either), the gateway's own switches and strict mode passed that way."""

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for camel, snake in _spellings(cls):
                if camel in data and snake in data:
                    raise ValueError(f"{camel}: given as both {camel} and {snake}: send one")
        return data


def _spellings(model: type[common.Model]) -> list[tuple[str, str]]:
    found = model.__dict__.get("_spelled_twice")
    if found is None:
        found = [
            tuple(info.validation_alias.choices)
            for info in model.model_fields.values()
            if isinstance(info.validation_alias, AliasChoices) and len(info.validation_alias.choices) == 2
        ]
        model._spelled_twice = found  # type: ignore[attr-defined]  # worked out once a model
    return found


HARM_CATEGORIES = (
    "HARM_CATEGORY_HARASSMENT",
    "HARM_CATEGORY_HATE_SPEECH",
    "HARM_CATEGORY_SEXUALLY_EXPLICIT",
    "HARM_CATEGORY_DANGEROUS_CONTENT",
    "HARM_CATEGORY_CIVIC_INTEGRITY",
    "HARM_CATEGORY_UNSPECIFIED",
    "HARM_CATEGORY_DEROGATORY",
    "HARM_CATEGORY_TOXICITY",
    "HARM_CATEGORY_VIOLENCE",
    "HARM_CATEGORY_SEXUAL",
    "HARM_CATEGORY_MEDICAL",
    "HARM_CATEGORY_DANGEROUS",
)
THRESHOLDS = (
    "HARM_BLOCK_THRESHOLD_UNSPECIFIED",
    "BLOCK_LOW_AND_ABOVE",
    "BLOCK_MEDIUM_AND_ABOVE",
    "BLOCK_ONLY_HIGH",
    "BLOCK_NONE",
    "OFF",
)
SCHEMA_TYPES = ("TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT")
LANGUAGES = (
    "zh-CN",
    "en-US",
    "ja-JP",
    "ko-KR",
    "fr-FR",
    "de-DE",
    "es-ES",
    "pt-BR",
    "hi-IN",
    "ar-XA",
    "it-IT",
    "tr-TR",
    "vi-VN",
    "th-TH",
    "ru-RU",
    "pl-PL",
    "nl-NL",
)


class Blob(Model):
    mimeType: str = field("mimeType", ...)
    data: str


class FileData(Model):
    mimeType: str = field("mimeType", ...)
    fileUri: str = field("fileUri", ...)


class FunctionCall(Model):
    name: str
    args: dict[str, Any] | None = None


class FunctionResponse(Model):
    name: str
    response: dict[str, Any]


class ExecutableCode(Model):
    language: (
        open_enum("contents[].parts[].executableCode.language", ("LANGUAGE_UNSPECIFIED", "PYTHON"), UPSTREAMS) | None
    ) = None
    code: str | None = None


class CodeExecutionResult(Model):
    outcome: open_enum(
        "contents[].parts[].codeExecutionResult.outcome",
        ("OUTCOME_UNSPECIFIED", "OUTCOME_OK", "OUTCOME_FAILED", "OUTCOME_DEADLINE_EXCEEDED"),
        UPSTREAMS,
    )
    output: str | None = None


class Part(Model):
    text: str | None = None
    inlineData: Blob | None = field("inlineData")
    fileData: FileData | None = field("fileData")
    functionCall: FunctionCall | None = field("functionCall")
    functionResponse: FunctionResponse | None = field("functionResponse")
    executableCode: ExecutableCode | None = field("executableCode")
    codeExecutionResult: CodeExecutionResult | None = field("codeExecutionResult")


class Content(Model):
    parts: list[Part]
    role: open_enum("contents[].role", ("user", "model", "function", "tool"), UPSTREAMS) | None = None


class FunctionDeclaration(Model):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Model):
    functionDeclarations: list[FunctionDeclaration] | None = field("functionDeclarations")
    codeExecution: dict[str, Any] | None = field("codeExecution")


class FunctionCallingConfig(Model):
    mode: (
        open_enum("toolConfig.functionCallingConfig.mode", ("MODE_UNSPECIFIED", "AUTO", "ANY", "NONE"), UPSTREAMS)
        | None
    ) = None
    allowedFunctionNames: list[str] | None = field("allowedFunctionNames")


class ToolConfig(Model):
    functionCallingConfig: FunctionCallingConfig | None = field("functionCallingConfig")


class SafetySetting(Model):
    category: open_enum("safetySettings[].category", HARM_CATEGORIES, UPSTREAMS)  # type: ignore[valid-type]
    threshold: open_enum("safetySettings[].threshold", THRESHOLDS, UPSTREAMS)  # type: ignore[valid-type]


class Schema(Model):
    # Optional, as in the SDK's Schema: a union (`anyOf`, which the SDK makes of `int | str`) names none.
    type: (
        open_enum(
            "generationConfig.responseSchema.type",  # type: ignore[valid-type]
            SCHEMA_TYPES + tuple(t.lower() for t in SCHEMA_TYPES[1:]),
            UPSTREAMS,
        )
        | None
    ) = None
    anyOf: list[Schema] | None = field("anyOf")
    items: Schema | None = None
    properties: dict[str, Schema] | None = None
    required: list[str] | None = None
    enum: list[str] | None = None
    nullable: bool | None = None
    minItems: Any = field("minItems")
    maxItems: Any = field("maxItems")


class ImageConfig(Model):
    aspectRatio: str | None = field("aspectRatio")
    imageSize: str | None = field("imageSize")


class ImageDelivery(Model):
    # Closed: the gateway's own switch for URL delivery (2.8, 7.3: only uppercase URI), which
    # rewrites the answer; no SDK's generate_content config can send it.
    delivery: Literal["URI"] | None = None


class ResponseFormat(Model):
    image: ImageDelivery | None = None


class ThinkingConfig(Model):
    includeThoughts: bool | None = field("includeThoughts")
    thinkingBudget: int | None = field("thinkingBudget")


class SpeechConfig(Model):
    languageCode: (
        open_enum(
            "generationConfig.speechConfig.languageCode",  # type: ignore[valid-type]
            LANGUAGES,
            UPSTREAMS,
        )
        | None
    ) = field("languageCode")


class GenerationConfig(Model):
    stopSequences: list[str] | None = field("stopSequences", max_length=5)
    responseMimeType: (
        open_enum(
            "generationConfig.responseMimeType",  # type: ignore[valid-type]
            ("text/plain", "application/json", "text/x.enum"),
            UPSTREAMS,
        )
        | None
    ) = field("responseMimeType")
    responseSchema: Schema | None = field("responseSchema")
    # Open: URL delivery goes by the answer's images, not by the modalities asked for.
    responseModalities: (
        list[
            open_enum(
                "generationConfig.responseModalities[]",  # type: ignore[valid-type]
                ("TEXT", "IMAGE", "AUDIO"),
                UPSTREAMS,
            )
        ]
        | None
    ) = field("responseModalities")
    candidateCount: int | None = field("candidateCount", ge=1)
    maxOutputTokens: int | None = field("maxOutputTokens", ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    topP: float | None = field("topP", ge=0, le=1)
    topK: int | float | None = field("topK", ge=1)  # google-genai types it a float, and sends 40.0
    seed: int | None = None
    presencePenalty: float | None = field("presencePenalty")
    frequencyPenalty: float | None = field("frequencyPenalty")
    responseLogprobs: bool | None = field("responseLogprobs")
    logprobs: int | None = Field(default=None, ge=0)
    enableEnhancedCivicAnswers: bool | None = field("enableEnhancedCivicAnswers")
    speechConfig: SpeechConfig | None = field("speechConfig")
    thinkingConfig: ThinkingConfig | None = field("thinkingConfig")
    mediaResolution: (
        open_enum(
            "generationConfig.mediaResolution",
            (  # type: ignore[valid-type]
                "MEDIA_RESOLUTION_UNSPECIFIED",
                "MEDIA_RESOLUTION_LOW",
                "MEDIA_RESOLUTION_MEDIUM",
                "MEDIA_RESOLUTION_HIGH",
            ),
            UPSTREAMS,
        )
        | None
    ) = field("mediaResolution")
    imageConfig: ImageConfig | None = field("imageConfig")
    responseFormat: ResponseFormat | None = field("responseFormat")


class GenerateContentRequest(Model):
    contents: Annotated[list[Content], Field(min_length=1)] | Content
    tools: list[Tool] | None = None
    toolConfig: ToolConfig | None = field("toolConfig")
    safetySettings: list[SafetySetting] | None = field("safetySettings")
    systemInstruction: Content | None = field("systemInstruction")
    generationConfig: GenerationConfig | None = field("generationConfig")
    cachedContent: str | None = field("cachedContent", pattern=r"^cachedContents/.+")

    @model_validator(mode="after")
    def _system_instruction_is_text(self) -> GenerateContentRequest:
        if self.systemInstruction is not None:
            for index, part in enumerate(self.systemInstruction.parts):
                if part.text is None:
                    raise ValueError(f"systemInstruction.parts[{index}]: a system instruction holds text only")
        return self

    def asks_for_image_urls(self) -> bool:
        config = self.generationConfig
        return bool(
            config
            and config.responseFormat
            and config.responseFormat.image
            and config.responseFormat.image.delivery == "URI"
        )
