"""URL delivery: Base64 images in answers stored and replaced by temporary signed URLs.

Images format (endpoints 6, 7): only with `response_format: "url"` on a non-streaming
request; native upstream URLs pass through. Content-generation (endpoint 9 with an image
model): only with `generationConfig.responseFormat.image.delivery: "URI"` (a gateway field,
removed before forwarding); inlineData parts become fileData, and images some upstreams
embed in text as Markdown data URLs get URLs too. The environment (`enabled`) and the key
(`url_delivery`, or a label in `allow_labels`) must both allow it, else 503
image_url_delivery_unavailable. A store failure falls back to Base64 with
`X-Image-Delivery-Fallback: base64`, or, in strict mode, is a 502 image_url_delivery_failed.
Only raster images (PNG, JPEG, WEBP, GIF, known by their bytes, whatever type the upstream
declared) are stored; anything else stays Base64 in the answer, with the same header.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxy.body import FormCheck, MultipartBody
from proxy.config import GatewayConfig
from proxy.delivery.service import DeliveryService, raster_type
from proxy.delivery.signing import Signer
from proxy.delivery.stores import BlobStore, LocalStore, RedisBlobStore, StoreError
from proxy.exchange import DECODED_LIMIT, AnswerTooLarge, Exchange, UpstreamResponse
from proxy.observability.metrics import URL_DELIVERY
from proxy.multipart import MultipartObserver
from proxy.pipeline import Plugin
from proxy.schemas.common import Violation

_IMAGE_ROUTES = ("image_generations", "image_edits")
_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+);base64,([A-Za-z0-9+/=]+)")
_FALLBACK = "X-Image-Delivery-Fallback"


class SigningKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    secret: str = Field(min_length=16, repr=False)


class S3Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bucket: str
    prefix: str = "modelgate/images/"
    endpoint_url: str | None = None       # for S3-compatible services
    region: str = "us-east-1"
    access_key_id: str | None = None      # else the environment's credentials
    secret_access_key: str | None = Field(default=None, repr=False)


class DeliverySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False                 # the environment's switch
    store: Literal["local", "redis", "s3"] = "local"
    s3: S3Settings | None = None
    dir: str = "./data/images"
    ttl_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    min_free_mb: float = Field(default=256, ge=0)  # local store: refuse new deliveries below this free disk
    strict: bool = False
    max_response_mb: float = Field(default=64, gt=0)
    signing_keys: list[SigningKey] = Field(default_factory=list)  # the first signs; all verify
    allow_labels: dict[str, str] = Field(default_factory=dict)    # keys with these labels may use it too

    @model_validator(mode="after")
    def _s3_needs_its_settings(self) -> DeliverySettings:
        if self.store == "s3" and self.s3 is None:
            raise ValueError("store s3 needs the s3 settings (bucket, endpoint_url ...)")
        return self


class UrlDelivery(Plugin):
    name = "url_delivery"
    Settings = DeliverySettings

    def configure(self, config: GatewayConfig) -> None:
        settings: DeliverySettings = self.settings
        where = {"local": settings.dir, "redis": config.state.url,
                 "s3": settings.s3.model_dump_json() if settings.s3 else ""}[settings.store]
        slot = f"url_delivery:{settings.store}:{where}"
        store: BlobStore
        if slot not in self.resources:
            self.resources[slot] = _make_store(settings, config)
        store = self.resources[slot]  # type: ignore[assignment]
        signer = Signer([(k.id, k.secret) for k in settings.signing_keys])
        self.service = DeliveryService(store, signer, settings.ttl_s, config.server)
        self.resources["url_delivery"] = self.service  # what the gateway serves /images/... with

    async def start(self) -> None:
        await self.service.start()

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        mode = _requested(ex)
        if mode is None:
            if (ex.route.name in _IMAGE_ROUTES and isinstance(ex.body_stream, MultipartBody)
                    and ex.multipart is not None and ex.multipart.field("response_format") is None):
                # The form's response_format may still come, after its files: decided when it does.
                ex.body_stream.checks.append(self._late_request(ex))
            return None
        refusal = self._refusal(ex)
        if refusal is not None:
            status, message, code, headers = refusal
            return ex.error_response(status, message, code, headers=headers)
        if mode == "content":
            body = ex.json()
            config = dict(body.get("generationConfig") or body.get("generation_config") or {})
            config.pop("responseFormat", None)  # a gateway field: never forwarded
            config.pop("response_format", None)
            key = "generationConfig" if "generationConfig" in body else "generation_config"
            ex.set_json({**body, key: config})
        ex.plugin_state[self.name] = mode
        ex.answer_limit = int(self.settings.max_response_mb * 1024 * 1024)
        return None

    def _refusal(self, ex: Exchange) -> tuple[int, str, str, dict[str, str]] | None:
        """Why URL delivery cannot be had for this request (status, message, code, headers), or None."""
        if not self._allowed(ex):
            found = (503, "image URL delivery is not enabled for this environment or key",
                     # not a passing fault: the official SDKs, which retry a 503 on their own, are told not to
                     "image_url_delivery_unavailable", {"x-should-retry": "false"})
        elif not self.service.available:
            found = (503, "the image store is failing; retry shortly", "image_delivery_store_unavailable",
                     {"Retry-After": "10"})
        elif (has_room := getattr(self.service.store, "has_room", None)) is not None and not has_room():
            found = (503, "the image store is out of space; retry later", "image_delivery_capacity_exhausted",
                     {"Retry-After": "60"})
        else:
            return None
        URL_DELIVERY.labels(ex.route.name, "unavailable").inc()
        return found

    def _late_request(self, ex: Exchange) -> FormCheck:
        """A form check: `response_format=url` arriving after the files is honoured (the answer is
        read after the upload ends), or, where delivery cannot be had, stops the upload."""
        def check(observer: MultipartObserver, finished: bool) -> Violation | None:
            if self.name in ex.plugin_state or ex.streaming or observer.field("response_format") != "url":
                return None
            refusal = self._refusal(ex)
            if refusal is not None:
                status, message, code, _ = refusal
                return Violation("", message, status, code)
            ex.plugin_state[self.name] = "images"
            ex.answer_limit = int(self.settings.max_response_mb * 1024 * 1024)
            return None

        return check

    async def on_upstream(self, ex: Exchange) -> None:
        """A channel that does not take `response_format` gets the request without it; its
        Base64 answer is then turned into URLs here."""
        if ex.plugin_state.get(self.name) != "images" or ex.channel is None:
            return
        if ex.channel.config.accepts_response_format:
            return
        body = ex.json()
        if isinstance(body, dict) and "response_format" in body:
            ex.set_json({k: v for k, v in body.items() if k != "response_format"})
        elif isinstance(ex.body_stream, MultipartBody):
            ex.body_stream.remove_field("response_format")

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        mode = ex.plugin_state.get(self.name)
        if mode is None or upstream.status >= 300:
            return
        limit = ex.answer_limit or 0
        try:
            upstream.decoded_body(limit or DECODED_LIMIT)
        except AnswerTooLarge:  # a small gzip can hide a large answer
            upstream.status = 502
            upstream.set_json(ex.format.error_payload(
                502, f"the upstream's answer is over the {limit / (1024 * 1024):g} MB processing limit",
                "image_response_too_large"))
            return
        body = upstream.json()
        if not isinstance(body, dict):
            return
        try:
            changed = await (self._images(body, ex) if mode == "images" else self._content(body, ex))
        except StoreError as exc:
            if self.settings.strict:
                URL_DELIVERY.labels(ex.route.name, "failed").inc()
                upstream.status = 502
                upstream.set_json(ex.format.error_payload(502, f"the images could not be stored: {exc}",
                                                          "image_url_delivery_failed"))
                return
            URL_DELIVERY.labels(ex.route.name, "fallback").inc()
            ex.response_headers = {**(ex.response_headers or {}), _FALLBACK: "base64"}
            return  # the upstream's Base64 answer, untouched
        URL_DELIVERY.labels(ex.route.name, "stored" if changed else "native").inc()
        if changed:
            upstream.set_json(body)

    def _allowed(self, ex: Exchange) -> bool:
        if not self.settings.enabled or ex.key is None:
            return False
        labels = ex.key.labels
        return ex.key.url_delivery or bool(self.settings.allow_labels) and all(
            labels.get(k) == v for k, v in self.settings.allow_labels.items())

    async def _mint(self, b64: str, ex: Exchange) -> tuple[str, str] | None:
        """A signed URL for a Base64 raster image, with its media type; None (and the fallback
        header) for anything else."""
        data = _decode(b64)
        kind = raster_type(data)
        if kind is None:
            ex.response_headers = {**(ex.response_headers or {}), _FALLBACK: "base64"}
            return None
        return await self.service.mint(data, kind, ex.request), kind

    async def _images(self, body: dict[str, Any], ex: Exchange) -> bool:
        changed = False
        for item in body.get("data") or []:
            if isinstance(item, dict) and isinstance(item.get("b64_json"), str):
                minted = await self._mint(item["b64_json"], ex)
                if minted is None:
                    continue
                del item["b64_json"]
                item["url"] = minted[0]
                changed = True
        return changed

    async def _content(self, body: dict[str, Any], ex: Exchange) -> bool:
        changed = False
        for candidate in body.get("candidates") or []:
            content = candidate.get("content") if isinstance(candidate, dict) else None
            for part in (content or {}).get("parts") or []:
                if not isinstance(part, dict):
                    continue
                inline = part.get("inlineData") or part.get("inline_data")
                if isinstance(inline, dict) and isinstance(inline.get("data"), str):
                    minted = await self._mint(inline["data"], ex)
                    if minted is None:
                        continue
                    part.pop("inlineData", None)
                    part.pop("inline_data", None)
                    part["fileData"] = {"mimeType": minted[1], "fileUri": minted[0]}
                    changed = True
                elif isinstance(part.get("text"), str) and "data:image/" in part["text"]:
                    text = await self._replace_data_urls(part["text"], ex)
                    changed = changed or text != part["text"]
                    part["text"] = text
        return changed

    async def _replace_data_urls(self, text: str, ex: Exchange) -> str:
        out, last = [], 0
        for match in _DATA_URL.finditer(text):
            minted = await self._mint(match[2], ex)
            if minted is None:
                continue  # not a raster image: the data URL stays as it was
            out.append(text[last:match.start()])
            out.append(minted[0])
            last = match.end()
        return "".join(out) + text[last:]


def _make_store(settings: DeliverySettings, config: GatewayConfig) -> BlobStore:
    if settings.store == "redis":
        return RedisBlobStore(config.state.url, config.state.prefix)
    if settings.store == "s3":
        from proxy.delivery.stores import S3Store

        s3 = settings.s3
        assert s3 is not None  # the settings' validator insists
        return S3Store(s3.bucket, s3.prefix, s3.endpoint_url, s3.region, s3.access_key_id, s3.secret_access_key)
    return LocalStore(settings.dir, min_free_mb=settings.min_free_mb)


def _requested(ex: Exchange) -> str | None:
    """'images' or 'content' when this request asks for URL delivery, else None."""
    if ex.streaming:
        return None
    route = ex.route.name
    if route in _IMAGE_ROUTES:
        if ex.multipart is not None:
            wanted = ex.multipart.field("response_format")
        else:
            body = ex.json()
            wanted = body.get("response_format") if isinstance(body, dict) else None
        return "images" if wanted == "url" else None
    if route == "generate_content":
        body = ex.json()
        config = (body.get("generationConfig") or body.get("generation_config")) if isinstance(body, dict) else None
        response_format = (config.get("responseFormat") or config.get("response_format")) if isinstance(config, dict) else None
        image = response_format.get("image") if isinstance(response_format, dict) else None
        return "content" if isinstance(image, dict) and image.get("delivery") == "URI" else None
    return None


def _decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise StoreError(f"the upstream's Base64 image could not be decoded: {exc}") from exc
