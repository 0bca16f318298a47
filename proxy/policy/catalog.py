"""The models a key may use on the configured channels: what `GET /v1/models` and
`GET /v1beta/models` answer, in the asking format's shape.

Channels name models by pattern (`msgmodel-*`, `*`), so a pattern is matched against the names
the gateway knows: the spec's models, the config's extra metric names, a channel's literal
names and the names it renames. A name of a spec family (msgmodel-, genmodel- ...) is listed only
for its own format, so a message SDK is not offered image models.
"""

from __future__ import annotations

from typing import Any

from proxy.config.model import GatewayConfig
from proxy.formats.base import Format
from proxy.formats.catalogue import SPEC_MODELS
from proxy.formats.translation import CODECS
from proxy.policy.channels import Channel, ChannelSet
from proxy.policy.keys import GatewayKey

_FAMILIES = (
    ("msgmodel-", "messages"),
    ("genmodel-", "content"),
    ("picmodel-", "content"),
    ("respmodel-", "responses"),
    ("imagegen-", "images"),
    ("videogen-", "video"),
)
_GLOB = frozenset("*?[")


def family(model: str) -> str | None:
    """The format a spec model belongs to, or None for a name the spec does not know."""
    return next((fmt for prefix, fmt in _FAMILIES if model.startswith(prefix)), None)


def known_models(config: GatewayConfig) -> set[str]:
    names = set(SPEC_MODELS) | set(config.observability.metrics.models) | set(config.models)
    for channel in config.channels:
        names.update(m for m in channel.models if not _GLOB & set(m))
        names.update(channel.rename)
    return names


def usable_models(
    config: GatewayConfig, channels: ChannelSet, key: GatewayKey | None, format_name: str | None
) -> list[str]:
    """Sorted names the key may use on some channel, of one format (None: of every format)."""
    found = []
    for model in known_models(config):
        if model in channels.aliases:  # a public name: served in every chat format, translated where need be
            if key is None or key.allows_model(model):
                found.append(model)
            continue
        wanted = family(model)
        if format_name is not None and wanted is not None and wanted != format_name:
            continue
        if key is not None and not key.allows_model(model):
            continue
        if any(
            channel.serves_model(model) and _serves_format(channel, format_name or wanted)
            for channel in channels.channels
        ):
            found.append(model)
    return sorted(found)


def _serves_format(channel: Channel, format_name: str | None) -> bool:
    """Whether the channel serves a format's models: its own, or, for a chat format, translated
    from any chat format it speaks (docs/translation.md)."""
    if format_name is None or format_name in channel.config.formats:
        return True
    return format_name in CODECS and channel.speaks_chat


def listing(
    config: GatewayConfig, channels: ChannelSet, key: GatewayKey | None, shape: Format, model: str | None = None
) -> dict[str, Any] | None:
    """The list in `shape`'s format: only its family's models, unless the shape is the generic
    one (the response SDK's list, which names every format's models); with `model`, that one
    model's entry, or None when it is not among them."""
    format_name = shape.name if shape.name in ("messages", "content") else None
    models = usable_models(config, channels, key, format_name)
    if model is None:
        return shape.model_list(models)
    return shape.model_entry(model) if model in models else None
