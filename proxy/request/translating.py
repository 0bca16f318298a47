"""The request for a channel of another chat format than the client's: the client's request, as
the plugins left it, read into the translation's records and written in the channel's format
(proxy/formats/translation/), with headers the gateway builds; or what that format cannot carry."""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web
from multidict import CIMultiDict

from proxy.core.exchange import Exchange
from proxy.core.pipeline import Pipeline
from proxy.core.runtime import Runtime
from proxy.formats import MESSAGES, Format
from proxy.formats.translation import MESSAGE_VERSION, Translation, Untranslatable, read_ask
from proxy.policy.channels import Channel


async def translated_request(
    ex: Exchange,
    runtime: Runtime,
    pipeline: Pipeline,
    channel: Channel,
    upstream_format: Format,
    sent: CIMultiDict[str],
) -> tuple[str, bytes] | Untranslatable:
    """The request for a channel of another format: the client's request (as the plugins,
    on_upstream included, left it) read into the translation's words and written in the
    channel's; or what that format cannot carry."""
    assert ex.model is not None
    ex.upstream_model = runtime.channels.upstream_model(channel, ex.route, ex.model)
    if pipeline.upstream_hooks:
        await pipeline.run_upstream(ex)
    try:
        assert ex.target is not None
        ask = read_ask(ex.format, ex.json(), ex.model, ex.streaming, ex.target.query)
        if ex.assumed_output is not None:  # what the request was charged for, not the format's default
            ask.assumed_output = ex.assumed_output
        ex.translation = translation = Translation(
            ex.format,
            upstream_format,
            ask,
            ex.upstream_model,
            redact=channel.redactor.text if channel.redactor is not None else str,
            stream_usage=channel.config.stream_usage,
        )
    except Untranslatable as refused:
        ex.translation = None
        return refused
    ex.headers = headers = translation.headers(sent, runtime.config.server.request_id_header)
    upstream_format.place_credential(channel.credential, headers)
    if upstream_format is MESSAGES:
        headers[channel.config.version_header or MESSAGES.sdk_version_header] = MESSAGE_VERSION
    target = translation.target(lambda path: upstream_format.versioned_path(path, channel.config.content_api_version))
    credential = upstream_format.credential_query(channel.credential)
    if credential:
        target += ("&" if "?" in target else "?") + urlencode(credential)
    return target, translation.body


def untranslatable(ex: Exchange, refused: Untranslatable, upstream_format: Format) -> web.Response:
    """The client's 400 for a request no channel left could take in its format: the first refusal."""
    return ex.error_response(
        400,
        f"{refused} (this model is served in the {upstream_format.name} format here)",
        "untranslatable_request",
        headers={"x-should-retry": "false"},
        param=refused.param,
    )


def carries(ex: Exchange, channel: Channel) -> bool:
    """Whether a channel can take this request: in its own format, or translated."""
    upstream_format = channel.translated_format(ex.route)
    if upstream_format is None:
        return True
    assert ex.target is not None and ex.model is not None
    try:
        ask = read_ask(ex.format, ex.json(), ex.model, ex.streaming, ex.target.query)
        Translation(ex.format, upstream_format, ask, ex.model)
    except Untranslatable:
        return False
    return True
