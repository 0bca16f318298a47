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
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from plugins.url_delivery.service import PATH, DeliveryService, raster_type
from plugins.url_delivery.signing import Signer
from plugins.url_delivery.stores import BlobStore, LocalStore, RedisBlobStore, StoreError
from proxy.config import GatewayConfig
from proxy.core.exchange import AnswerLimit, Exchange
from proxy.core.plugin import Joins, Plugin, PluginRoute
from proxy.core.upstream_response import AnswerTooLarge, UpstreamResponse
from proxy.formats import ACCOUNT
from proxy.request.body import FormCheck, MultipartBody
from proxy.schemas.common import Violation
from proxy.wire.multipart import MultipartObserver

URL_DELIVERY = Counter(
    "modelgate_url_delivery",
    "URL-delivery outcomes per answer: stored, native (the upstream's "
    "own URLs), fallback (Base64), failed (strict), unavailable (refused before the upstream)",
    ["route", "outcome"],
)

_IMAGE_ROUTES = ("image_generations", "image_edits")
_FALLBACK = "X-Image-Delivery-Fallback"
_SERVICE = "url_delivery.service"  # the live instance's service, among the gateway's resources


class SigningKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    secret: str = Field(min_length=16, repr=False)


class S3Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bucket: str
    prefix: str = "modelgate/images/"
    endpoint_url: str | None = None  # for S3-compatible services
    region: str = "us-east-1"
    access_key_id: str | None = None  # else the environment's credentials
    secret_access_key: str | None = Field(default=None, repr=False)


class DeliverySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False  # the environment's switch
    store: Literal["local", "redis", "s3"] = "local"
    s3: S3Settings | None = None
    dir: str = "./data/images"
    ttl_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    min_free_mb: float = Field(default=256, ge=0)  # local store: refuse new deliveries below this free disk
    strict: bool = False
    max_response_mb: float = Field(default=64, gt=0)
    signing_keys: list[SigningKey] = Field(default_factory=list)  # the first signs; all verify
    allow_labels: dict[str, str] = Field(default_factory=dict)  # keys with these labels may use it too

    @model_validator(mode="after")
    def _s3_needs_its_settings(self) -> DeliverySettings:
        if self.store == "s3" and self.s3 is None:
            raise ValueError("store s3 needs the s3 settings (bucket, endpoint_url ...)")
        return self


class DeliveryKey(BaseModel):
    """What a key entry may say: this key may have URL delivery (else a label in `allow_labels` decides)."""

    model_config = ConfigDict(extra="forbid")
    url_delivery: bool = False


class UrlDelivery(Plugin):
    name = "url_delivery"
    Settings = DeliverySettings
    KeySettings = DeliveryKey
    joins = Joins(routes=frozenset({*_IMAGE_ROUTES, "generate_content"}))
    requires = frozenset({"caller"})  # allowed per key
    order = 400

    @classmethod
    def routes(cls) -> Sequence[PluginRoute]:
        return (PluginRoute("GET", PATH, _serve_image),)

    @classmethod
    def config_problems(cls, config: GatewayConfig, workers: int) -> list[str]:
        delivery = config.plugins.get(cls.name, {})
        if workers > 1 and delivery.get("enabled") and not delivery.get("signing_keys"):
            return [
                f"plugins.{cls.name}.signing_keys: required with {workers} workers: without them each "
                "process signs with a key of its own, and a URL minted by one worker fails on another"
            ]
        return []

    def configure(self, config: GatewayConfig) -> None:
        settings: DeliverySettings = self.settings
        where = {
            "local": settings.dir,
            "redis": config.state.url,
            "s3": settings.s3.model_dump_json() if settings.s3 else "",
        }[settings.store]
        slot = f"url_delivery:{settings.store}:{where}"
        store: BlobStore
        if slot not in self.resources:
            self.resources[slot] = _make_store(settings, config)
        store = self.resources[slot]  # type: ignore[assignment]
        signer = Signer([(k.id, k.secret) for k in settings.signing_keys])
        self.service = DeliveryService(store, signer, settings.ttl_s, config.server)
        self.answer_limit = AnswerLimit(int(settings.max_response_mb * 1024 * 1024), "image_response_too_large")
        self.resources[_SERVICE] = self.service  # what the gateway serves /images/... with

    async def start(self) -> None:
        await self.service.start()

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        if not _requested(ex):
            if (
                ex.route.name in _IMAGE_ROUTES
                and isinstance(ex.body_stream, MultipartBody)
                and ex.multipart is not None
                and ex.multipart.field("response_format") is None
            ):
                # The form's response_format may still come, after its files: decided when it does.
                ex.body_stream.checks.append(self._late_request(ex))
            return None
        refusal = self._refusal(ex)
        if refusal is not None:
            status, message, code, headers = refusal
            return ex.error_response(status, message, code, headers=headers)
        stripped = ex.format.without_delivery_fields(ex.json())  # a gateway field: never forwarded
        if stripped is not None:
            ex.set_json(stripped)
        ex.state(self)["delivers"] = True
        ex.answer_limit = self.answer_limit
        return None

    def _refusal(self, ex: Exchange) -> tuple[int, str, str, dict[str, str]] | None:
        """Why URL delivery cannot be had for this request (status, message, code, headers), or None."""
        if not self._allowed(ex):
            found = (
                503,
                "image URL delivery is not enabled for this environment or key",
                # not a passing fault: the official SDKs, which retry a 503 on their own, are told not to
                "image_url_delivery_unavailable",
                {"x-should-retry": "false"},
            )
        elif not self.service.available:
            found = (
                503,
                "the image store is failing; retry shortly",
                "image_delivery_store_unavailable",
                {"Retry-After": "10"},
            )
        elif (has_room := getattr(self.service.store, "has_room", None)) is not None and not has_room():
            found = (
                503,
                "the image store is out of space; retry later",
                "image_delivery_capacity_exhausted",
                {"Retry-After": "60"},
            )
        else:
            return None
        URL_DELIVERY.labels(ex.route.name, "unavailable").inc()
        return found

    def _late_request(self, ex: Exchange) -> FormCheck:
        """A form check: `response_format=url` arriving after the files is honoured (the answer is
        read after the upload ends), or, where delivery cannot be had, stops the upload."""

        def check(observer: MultipartObserver, finished: bool) -> Violation | None:
            if "delivers" in ex.state(self) or ex.streaming or observer.field("response_format") != "url":
                return None
            refusal = self._refusal(ex)
            if refusal is not None:
                status, message, code, _ = refusal
                return Violation("", message, status, code)
            ex.state(self)["delivers"] = True
            ex.answer_limit = self.answer_limit
            return None

        return check

    async def on_upstream(self, ex: Exchange) -> None:
        """A channel that does not take `response_format` gets the request without it; its
        Base64 answer is then turned into URLs here."""
        if "delivers" not in ex.state(self) or ex.route.name not in _IMAGE_ROUTES or ex.channel is None:
            return
        if ex.channel.config.accepts_response_format:
            return
        body = ex.json()
        if isinstance(body, dict) and "response_format" in body:
            ex.set_json({k: v for k, v in body.items() if k != "response_format"})
        elif isinstance(ex.body_stream, MultipartBody):
            ex.body_stream.remove_field("response_format")

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if "delivers" not in ex.state(self) or upstream.status >= 300:
            return
        try:
            upstream.decoded_body(self.answer_limit.size)
        except AnswerTooLarge:  # a small gzip can hide a large answer
            upstream.status = 502
            upstream.set_json(ex.format.error_payload(502, self.answer_limit.message, self.answer_limit.code))
            return
        body = upstream.json()
        if not isinstance(body, dict):
            return
        try:
            changed = await self._place_urls(body, ex)
        except StoreError as exc:
            if self.settings.strict:
                URL_DELIVERY.labels(ex.route.name, "failed").inc()
                upstream.status = 502
                upstream.set_json(
                    ex.format.error_payload(502, f"the images could not be stored: {exc}", "image_url_delivery_failed")
                )
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
        return (
            ex.key.settings.get("url_delivery", False)
            or bool(self.settings.allow_labels)
            and all(labels.get(k) == v for k, v in self.settings.allow_labels.items())
        )

    async def _mint(self, b64: str, ex: Exchange) -> tuple[str, str] | None:
        """A signed URL for a Base64 raster image, with its media type; None (and the fallback
        header) for anything else."""
        data = _decode(b64)
        kind = raster_type(data)
        if kind is None:
            ex.response_headers = {**(ex.response_headers or {}), _FALLBACK: "base64"}
            return None
        return await self.service.mint(data, kind, ex.request), kind

    async def _place_urls(self, answer: Any, ex: Exchange) -> bool:
        """Each raster image of the answer stored, and a URL put where it was; whether any was."""
        changed = False
        for image in ex.format.embedded_images(answer):
            minted = await self._mint(image.data, ex)
            if minted is not None:
                image.place(*minted)
                changed = True
        return changed


async def _serve_image(request: web.Request, resources: Mapping[str, Any]) -> web.StreamResponse:
    service: DeliveryService | None = resources.get(_SERVICE)
    if service is None:
        return ACCOUNT.error_response(404, "image URL delivery is not configured", "not_found")
    return await service.serve(request)


def _make_store(settings: DeliverySettings, config: GatewayConfig) -> BlobStore:
    if settings.store == "redis":
        return RedisBlobStore(config.state.url, config.state.prefix)
    if settings.store == "s3":
        from plugins.url_delivery.stores import S3Store

        s3 = settings.s3
        assert s3 is not None  # the settings' validator insists
        return S3Store(s3.bucket, s3.prefix, s3.endpoint_url, s3.region, s3.access_key_id, s3.secret_access_key)
    return LocalStore(settings.dir, min_free_mb=settings.min_free_mb)


def _requested(ex: Exchange) -> bool:
    """Whether this request asks for URL delivery (never a stream's)."""
    if ex.streaming or not UrlDelivery.joins(ex.route):  # type: ignore[misc]
        return False
    if ex.multipart is not None:
        return ex.multipart.field("response_format") == "url"
    return ex.format.asks_for_image_urls(ex.json())


def _decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise StoreError(f"the upstream's Base64 image could not be decoded: {exc}") from exc
