"""The spec's wire formats and the chat-completions format, one module each; `FORMATS` maps a
format's config name to it."""

from __future__ import annotations

from proxy.formats.account import AccountFormat
from proxy.formats.base import Format, Generation, KeyLocation, Usage
from proxy.formats.chat import ChatFormat
from proxy.formats.content import ContentFormat
from proxy.formats.images import ImagesFormat
from proxy.formats.message import MessageFormat
from proxy.formats.models import ModelsFormat
from proxy.formats.response import ResponseFormat
from proxy.formats.video import VideoFormat

MESSAGES = MessageFormat()
CONTENT = ContentFormat()
RESPONSES = ResponseFormat()
IMAGES = ImagesFormat()
VIDEO = VideoFormat()
CHAT = ChatFormat()
ACCOUNT = AccountFormat()
MODELS = ModelsFormat(MESSAGES, CONTENT)  # not a wire format a channel serves: not in FORMATS

FORMATS: dict[str, Format] = {f.name: f for f in (MESSAGES, CONTENT, RESPONSES, CHAT, IMAGES, VIDEO, ACCOUNT)}
FORMAT_NAMES = tuple(FORMATS)

__all__ = [
    "ACCOUNT",
    "CHAT",
    "CONTENT",
    "FORMATS",
    "FORMAT_NAMES",
    "IMAGES",
    "MESSAGES",
    "MODELS",
    "RESPONSES",
    "VIDEO",
    "AccountFormat",
    "ChatFormat",
    "ContentFormat",
    "Format",
    "Generation",
    "ImagesFormat",
    "KeyLocation",
    "MessageFormat",
    "ModelsFormat",
    "ResponseFormat",
    "Usage",
    "VideoFormat",
]
