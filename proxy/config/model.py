"""The config schema: every key the gateway reads, its default, and its rules.

The defaults are the embedded configuration: `GatewayConfig()` alone serves every
endpoint from the in-process upstream simulator with memory state.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import ipaddress
import os
import re
import socket
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from proxy.config.console import ConsoleConfig
from proxy.config.key_store import KeyStoreConfig
from proxy.config.prices import PriceConfig
from proxy.formats import FORMAT_NAMES
from proxy.state import connect as topology
from proxy.wire.routes import CHAT_ROUTES, ROUTE_NAMES

# A channel's `formats` or `endpoints` that make it a chat channel (a model target must be one).
CHAT_SPEAKING = CHAT_ROUTES | {"content", "chat"}

SIMULATOR = "simulator"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token
_LISTEN = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^:\s]+):(?P<port>\d{1,5})\Z")

_ADMIN_TOKEN = re.compile(r"^[!-~]{16,}\Z")  # it is compared with a header's Bearer value

PositiveFloat = Annotated[float, Field(gt=0)]


def _host_port(value: str) -> str:
    match = _LISTEN.match(value)
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError("not a HOST:PORT address (for example 127.0.0.1:8080)")
    return value


def same_address(one: str, other: str) -> bool:
    """Whether two HOST:PORT listeners would take each other's connections: the same port, and an
    address in common or one listening on every address.

    Hosts are compared by the addresses a bind would take for them, not as text: `localhost`,
    `127.1` and `127.0.0.1` are one address, `[::1]` and `[0:0:0:0:0:0:0:1]` another, and a
    hostname is its addresses. Workers bind both listeners with SO_REUSEPORT, so two spellings of
    one address would not fail to bind: the kernel would spread clients over the admin listener
    and scrapes over the clients' one. Names are resolved only when the ports are the same; one
    that does not resolve is no overlap here (its bind fails, and says why), and a started gateway
    compares the sockets it bound as well (proxy/process/server.py)."""
    a, b = _LISTEN.match(one), _LISTEN.match(other)
    if a is None or b is None or int(a["port"]) != int(b["port"]):
        return False
    if a["host"].lower() == b["host"].lower():
        return True
    first, second = bound_addresses(a["host"].strip("[]")), bound_addresses(b["host"].strip("[]"))
    return any(address.is_unspecified for address in first | second) or bool(first & second)


@functools.lru_cache(maxsize=64)
def bound_addresses(host: str) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a listener on `host` binds, resolved as the server resolves them (numeric
    forms need no lookup; `localhost` and the like come from the hosts file). Kept once resolved:
    every reload checks the listeners again, from the event loop, and they change only at a restart."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):  # no such name, or no name at all
        return frozenset()
    return frozenset(
        normal_address(address[0]) for family, _, _, _, address in found if family in (socket.AF_INET, socket.AF_INET6)
    )


def normal_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """One spelling per address: an IPv6 zone dropped, an IPv4-mapped IPv6 address as IPv4."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _simple_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
    return value


# Names of channels and keys: they appear in logs, metrics and URLs, so they stay plain.
SimpleName = Annotated[str, AfterValidator(_simple_name)]


def _header_fields(headers: dict[str, str]) -> dict[str, str]:
    """Header names that are HTTP tokens and values without line breaks: anything else would
    be refused at every request, or write a header of its own."""
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise ValueError(f"{name!r} is not a header name")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"the value of {name} holds a line break")
    return headers


class Strict(BaseModel):
    """A config section: unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(Strict):
    listen: str = "127.0.0.1:8080"
    public_base_url: str | None = None
    max_json_body_mb: PositiveFloat = 64.0
    # One server-sent event from an upstream, held until its blank line: past it the stream ends
    # with the format's error event (an upstream that never ends an event costs this much, no more).
    max_stream_event_mb: PositiveFloat = 8.0
    max_upload_mb: PositiveFloat = 512.0  # multipart edits (streamed): 16 images under 25 MB fit
    drain_timeout_s: PositiveFloat = 60.0  # on SIGTERM: how long in-flight requests may take to finish
    # An HTTP token: the name goes into answers as it is written (proxy/process/shedding.py writes its own heads).
    request_id_header: str = Field(default="X-Request-Id", pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
    max_connections: int = Field(default=10_000, ge=1)  # client connections; past it requests get 503
    # Requests one worker serves at once, streams included; past it 503 `overloaded` before the body
    # is read. "auto": a bound that follows the worker's measured capacity (proxy/process/admission.py).
    max_in_flight: int | Literal["auto"] = "auto"
    max_loop_delay_ms: float = Field(default=50.0, ge=1, le=10_000)  # auto: the event-loop delay it keeps under
    max_cpu_busy: float = Field(
        default=0.9, gt=0, le=1
    )  # auto: the share of its CPU a worker keeps busy, at most (1: no bound)
    listen_backlog: int = Field(default=1024, ge=1, le=65_535)  # connections the kernel queues unaccepted (next start)
    max_header_kb: int = Field(default=32, ge=1, le=1024)  # request line and headers together: 431 past it
    max_headers: int = Field(default=100, ge=8, le=1000)
    client_idle_s: PositiveFloat = 30.0  # longest silence inside a request body: 408 past it
    body_timeout_s: PositiveFloat = 300.0  # longest a whole request body may take to arrive: 408 past it
    # Signed image and video URLs go on public_base_url, else on the address the request came in
    # on; the client's Host header only when the operator says so (a client must not choose it).
    base_url_from_host: bool = False
    keepalive_timeout_s: PositiveFloat = 75.0  # idle keep-alive connections, and headers slow to arrive, are closed
    keepalive_requests: int = Field(default=1000, ge=1)  # then `Connection: close`: load spreads to new connections
    workers: int | None = Field(default=None, ge=1, le=256)  # unset: every core with Redis state, 1 with memory
    # Only the key places and headers the interface names (spec section 5); off, the places the
    # official SDKs use are read too: `Authorization: Bearer` and `anthropic-version` on endpoint 8,
    # `x-goog-api-key` on endpoints 9-10.
    strict_interface: bool = False
    # /metrics, the detailed /readyz and whatever else is administrative are served here, apart
    # from the clients' listener; null or empty: no admin listener (docs/security.md).
    admin_listen: str | None = "127.0.0.1:8081"
    # Set: the main listener serves the admin routes too, to `Authorization: Bearer <admin_token>`.
    admin_token: str | None = Field(default=None, repr=False)
    # How often the config file and each `${file:}` it names are read again: a change reloads the
    # config as SIGHUP does (a mounted Secret or ConfigMap changes in place); 0: only SIGHUP does.
    watch_config_s: float = Field(default=1.0, ge=0, le=3600)
    # A change is reloaded once the files have read the same for this long (two looks at least):
    # a file being rewritten in place is not loaded half-written (proxy/process/watch.py).
    watch_settle_s: float = Field(default=2.0, ge=0, le=3600)

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("admin_listen")
    @classmethod
    def _admin_listen_is_host_port(cls, value: str | None) -> str | None:
        return _host_port(value) if value else None

    @field_validator("admin_token")
    @classmethod
    def _admin_token_is_a_strong_word(cls, value: str | None) -> str | None:
        # Never quoted in the message: it is a secret, and check-config prints what it says.
        if value is not None and not _ADMIN_TOKEN.match(value):
            raise ValueError(
                "must be at least 16 printable ASCII characters with no spaces "
                "(for example the output of `openssl rand -hex 32`)"
            )
        return value

    @field_validator("max_in_flight", mode="before")
    @classmethod
    def _in_flight_bound(cls, value: Any) -> int | str:
        if value == "auto" or isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError("a number of requests (at least 1), or 'auto'")

    @field_validator("public_base_url")
    @classmethod
    def _public_base_url_is_http(cls, value: str | None) -> str | None:
        if value is not None and not _is_http_url(value):
            raise ValueError("not an http(s) URL")
        return value.rstrip("/") if value else value

    @property
    def host(self) -> str:
        return _LISTEN.match(self.listen)["host"].strip("[]")  # type: ignore[index]

    @property
    def port(self) -> int:
        return int(_LISTEN.match(self.listen)["port"])  # type: ignore[index]

    @property
    def admin_address(self) -> tuple[str, int] | None:
        """The admin listener's host and port, or None when it is off."""
        if not self.admin_listen:
            return None
        match = _LISTEN.match(self.admin_listen)
        return match["host"].strip("[]"), int(match["port"])  # type: ignore[index]


class StateConfig(Strict):
    backend: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "modelgate:"
    affinity_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    max_items: int = Field(default=200_000, ge=100)  # memory backend: entries per store, oldest dropped first
    pending_pins: int = Field(default=10_000, ge=0)  # ids made while the store is away, kept until it returns
    # How long a limit or budget check waits on the store before its fail mode decides.
    check_timeout_s: float = Field(default=0.5, gt=0, le=10)

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        topology.parse(value)  # one server, a Sentinel-named primary or a Cluster (proxy/state/connect.py)
        return value

    @model_validator(mode="after")
    def _prefix_fits_slots(self) -> StateConfig:
        if ("{" in self.prefix or "}" in self.prefix) and topology.mode_of(self.url) is topology.Mode.CLUSTER:
            raise ValueError("prefix: no { or } on a Redis Cluster: keys take their hash tags after it")
        return self


class Timeouts(Strict):
    connect_s: PositiveFloat = 10.0
    first_byte_s: PositiveFloat = 120.0
    idle_s: PositiveFloat = 120.0
    total_s: PositiveFloat = 900.0


class Pool(Strict):
    # Open connections to the channel: none by default (each stream holds one for its whole
    # life); past a cap a request waits up to connect_s for one, then gets a 503.
    max_connections: int | None = Field(default=None, ge=1)
    max_idle: int = Field(default=256, ge=0)  # kept open between requests for reuse
    keepalive_s: PositiveFloat = 60.0  # an idle connection is retired after this


class HealthCheck(Strict):
    """An optional active check: GET `path` every `interval_s`; `unhealthy_after` failures in a
    row take the channel out of rotation until `healthy_after` successes in a row bring it back."""

    path: str = Field(pattern=r"^/[!-~]*$")  # printable ASCII, as it goes on the request line
    interval_s: PositiveFloat = 10.0
    timeout_s: PositiveFloat = 2.0
    unhealthy_after: int = Field(default=2, ge=1)
    healthy_after: int = Field(default=1, ge=1)
    expect_status: list[int] = Field(default_factory=lambda: [200], min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)  # an upstream credential, say

    @field_validator("headers")
    @classmethod
    def _headers_are_fields(cls, value: dict[str, str]) -> dict[str, str]:
        return _header_fields(value)


class SimulatorSettings(Strict):
    """Defaults of the embedded upstream simulator; each may be overridden per request by a header."""

    latency_ms: float = Field(default=0.0, ge=0)
    chunk_delay_ms: float = Field(default=5.0, ge=0)
    output_tokens: int = Field(default=24, ge=1, le=100_000)
    video_queued_s: float = Field(default=1.0, ge=0)
    video_processing_s: float = Field(default=2.0, ge=0)
    fail_status: int | None = Field(default=None, ge=400, le=599)  # answer every request with this status


class ChannelConfig(Strict):
    name: SimpleName
    base_url: str
    formats: list[Literal[FORMAT_NAMES]] = Field(default_factory=lambda: list(FORMAT_NAMES))  # type: ignore[valid-type]
    endpoints: list[Literal[ROUTE_NAMES]] | None = None  # type: ignore[valid-type]
    models: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    rename: dict[str, str] = Field(default_factory=dict)
    priority: int = 0
    weight: PositiveFloat = 1.0
    credential: str | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts)
    pool: Pool = Field(default_factory=Pool)
    health_check: HealthCheck | None = None
    simulator: SimulatorSettings | None = None
    # Images format: does this upstream take `response_format` itself? If not, the gateway
    # removes it and turns the Base64 answer into URLs when URL delivery was asked for.
    accepts_response_format: bool = True
    # Chat completions: does this upstream take `stream_options.include_usage`? If not, a stream
    # whose client did not ask for its usage goes as the client sent it, and is charged an estimate.
    stream_usage: bool = True
    # Message format: the header the client's API version goes upstream in (the value of
    # msgapi-version or anthropic-version, whichever came); unset, as the client sent it (both
    # headers when both came with one value, msgapi-version alone when they differ).
    version_header: Literal["msgapi-version", "anthropic-version"] | None = None
    # Content generation: the API version in the upstream path (`v1beta/models/...`); unset, the
    # client's own (`/v1/` or `/v1beta/`).
    content_api_version: Literal["v1", "v1beta"] | None = None

    @field_validator("base_url")
    @classmethod
    def _base_url_is_http_or_simulator(cls, value: str) -> str:
        if value != SIMULATOR and not _is_http_url(value):
            raise ValueError("not an http(s) URL (or the word 'simulator')")
        return value.rstrip("/")

    @field_validator("models")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern:
                raise ValueError("an empty model pattern matches nothing")
            fnmatch.translate(pattern)
        return value

    @field_validator("credential")
    @classmethod
    def _credential_fits_a_header(cls, value: str | None) -> str | None:
        if value is not None and re.search(r"[\x00-\x1f\x7f]", value):  # a two-line file: every request would fail
            raise ValueError("holds a line break or another control character")
        return value

    @model_validator(mode="after")
    def _simulator_settings_need_simulator(self) -> ChannelConfig:
        if self.simulator is not None and self.base_url != SIMULATOR:
            raise ValueError("'simulator' settings apply only with base_url: simulator")
        return self

    @property
    def is_simulator(self) -> bool:
        return self.base_url == SIMULATOR


class Rates(Strict):
    """Limits over a sliding minute: requests and tokens (input + output, as the upstream reports)."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)


class TenantLimits(Rates):
    """A stored tenant's limits: every key of it together (the key store)."""

    concurrent: int | None = Field(default=None, ge=1)


class KeyLimits(TenantLimits):
    models: dict[str, Rates] = Field(default_factory=dict)  # glob -> limits for this key on those models


class KeyConfig(Strict):
    """A gateway API key: give the key itself (through ${VAR}) or its SHA-256 hex digest. Plugins
    may add fields of their own (their `KeySettings`); only those are taken beside these."""

    model_config = ConfigDict(extra="allow")  # checked against the plugins' fields (proxy/registry.py)

    name: SimpleName
    key: str | None = Field(default=None, repr=False)
    sha256: str | None = None
    enabled: bool = True
    expires_at: datetime | None = None
    models: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    endpoints: list[Literal[ROUTE_NAMES]] | None = None  # type: ignore[valid-type]
    labels: dict[str, str] = Field(default_factory=dict)
    limits: KeyLimits = Field(default_factory=KeyLimits)

    @field_validator("sha256")
    @classmethod
    def _sha256_is_hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("not a SHA-256 hex digest (64 hex characters)")
        return value.lower() if value else value

    @field_validator("expires_at")
    @classmethod
    def _expiry_has_a_zone(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)  # a bare timestamp is read as UTC
        return value

    @model_validator(mode="after")
    def _key_or_hash(self) -> KeyConfig:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' and 'sha256'")
        if self.key is not None and len(self.key) < 8:
            raise ValueError("a key must be at least 8 characters")
        return self

    def digest_hex(self) -> str:
        return self.sha256 or hashlib.sha256((self.key or "").encode()).hexdigest()


class RouteConfig(Strict):
    plugins: list[str] | None = None
    max_body_mb: PositiveFloat | None = None  # this route's body limit (JSON, raw or multipart); else the server's
    body_timeout_s: PositiveFloat | None = None  # this route's whole-body deadline; else the server's
    # Chat routes only: fail over also when an upstream took the request and closed or went
    # quiet before answering (it may have billed for it). docs/resilience.md.
    failover_unanswered: bool = False
    # Keyed routes only: serve it with a configured pipeline that names no caller (no plugin
    # providing it), so anyone who reaches the gateway uses the channel's credential. Without it
    # such a pipeline is a config problem; with it, a warning at every start and reload.
    public: bool = False


class LoggingConfig(Strict):
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True


class ResilienceConfig(Strict):
    max_attempts: int = Field(default=3, ge=1, le=10)  # per request, across channels, before the first byte
    backoff_s: float = Field(default=0.05, ge=0, le=10)  # before each retry, doubling
    failover_on_429: bool = False  # try another channel when one says 429
    breaker_failures: int = Field(default=5, ge=1)  # failures in a row that open a channel's breaker
    breaker_open_s: float = Field(default=30.0, gt=0)  # how long it stays open before one probe


class MetricsConfig(Strict):
    enabled: bool = True
    models: list[str] = Field(default_factory=list)  # more model names to count by name (others: "other")


class TracingConfig(Strict):
    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    service_name: str = "modelgate"
    headers: dict[str, str] = Field(default_factory=dict)  # sent with every export (a collector's API key)
    compression: Literal["none", "gzip"] = "none"
    # OTLP/HTTP's two encodings (the names OTEL_EXPORTER_OTLP_PROTOCOL uses): JSON costs less to write.
    protocol: Literal["http/json", "http/protobuf"] = "http/json"
    # Exported whatever the sampler decided: a request answered 5xx, and one that took longer than this.
    keep_errors: bool = True
    keep_slower_than_ms: float | None = Field(default=None, gt=0)
    # More of the resource every span names (deployment.environment, service.namespace ...), over
    # OTEL_RESOURCE_ATTRIBUTES; service.name is `service_name`.
    resource: dict[str, str] = Field(default_factory=dict)
    # A trace's page in the team's trace viewer, `{trace_id}` replaced by its 32 hex digits: an
    # exported request's access line carries it (`trace_url`), and the console links to it.
    viewer_url: str | None = None

    @field_validator("viewer_url")
    @classmethod
    def _viewer_url(cls, value: str | None) -> str | None:
        if value is not None and ("{trace_id}" not in value or not _is_http_url(value.replace("{trace_id}", "x"))):
            raise ValueError("an http(s) URL with {trace_id} in it")
        return value

    @field_validator("headers")
    @classmethod
    def _headers_are_fields(cls, value: dict[str, str]) -> dict[str, str]:
        return _header_fields(value)

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_http(cls, value: str) -> str:
        if not _is_http_url(value):
            raise ValueError("not an http(s) URL")
        return value


class ValidationConfig(Strict):
    # The request schemas' open enumerations (proxy/schemas/enums.py) closed again: a string the
    # interface does not list is a 400, as the interface's tables read, instead of passing upstream.
    strict_enums: bool = False


class ObservabilityConfig(Strict):
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)


class ModelTarget(Strict):
    """One place a public model name (`models:`) is served: a channel, the model's name there,
    and its share of first attempts when the list is weighted."""

    channel: SimpleName
    model: str = Field(min_length=1, max_length=256)
    weight: PositiveFloat | None = None


def _default_keys() -> list[KeyConfig]:
    return [KeyConfig(name="demo", key="sk-demo-key")]


def _default_channels() -> list[ChannelConfig]:
    return [ChannelConfig(name="simulator", base_url=SIMULATOR, credential="sim-upstream-key")]


class GatewayConfig(Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    keys: list[KeyConfig] = Field(default_factory=_default_keys)
    channels: list[ChannelConfig] = Field(default_factory=_default_channels)
    routes: dict[Literal[ROUTE_NAMES], RouteConfig] = Field(default_factory=dict)  # type: ignore[valid-type]
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    resilience: ResilienceConfig = Field(default_factory=ResilienceConfig)
    prices: list[PriceConfig] = Field(default_factory=list)  # proxy/config/prices.py
    key_store: KeyStoreConfig = Field(default_factory=KeyStoreConfig)  # proxy/config/key_store.py
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)  # proxy/config/console.py
    # Public model names of the chat routes, each served by its targets in order (a request goes
    # to the next when one fails, under the resend rules), of any chat format (translated); with
    # weights, the first attempt is drawn by them and the rest follow in order.
    models: dict[str, list[ModelTarget]] = Field(default_factory=dict)

    @field_validator("models")
    @classmethod
    def _model_targets_are_chat_channels(
        cls, value: dict[str, list[ModelTarget]], info: ValidationInfo
    ) -> dict[str, list[ModelTarget]]:
        channels = {channel.name: channel for channel in info.data.get("channels") or []}
        problems = []
        for name, targets in value.items():
            if not targets:
                problems.append(f"{name}: names no target")
            seen: set[str] = set()
            for i, target in enumerate(targets):
                channel = channels.get(target.channel)
                where = f"{name}[{i}].channel"
                if channel is None:
                    problems.append(f"{where}: no channel is named {target.channel!r}")
                elif target.channel in seen:
                    problems.append(f"{where}: {target.channel!r} is named twice")
                elif not set(channel.formats if channel.endpoints is None else channel.endpoints) & CHAT_SPEAKING:
                    problems.append(f"{where}: {target.channel!r} serves no chat format")
                seen.add(target.channel)
        if problems:
            raise ValueError("; ".join(problems))  # every one at once, as check-config lists problems
        return value

    @field_validator("routes")
    @classmethod
    def _failover_unanswered_on_chat_routes(cls, value: dict[str, RouteConfig]) -> dict[str, RouteConfig]:
        for name, route in value.items():
            if route.failover_unanswered and name not in CHAT_ROUTES:
                raise ValueError(
                    f"routes.{name}.failover_unanswered: only chat routes may send a request "
                    f"again after an upstream took it ({', '.join(sorted(CHAT_ROUTES))})"
                )
        return value

    @field_validator("keys")
    @classmethod
    def _keys_unique(cls, value: list[KeyConfig]) -> list[KeyConfig]:
        names: set[str] = set()
        digests: set[str] = set()
        for key in value:
            if key.name in names:
                raise ValueError(f"key name {key.name!r} is used twice")
            if key.digest_hex() in digests:
                raise ValueError(f"key {key.name!r} has the same secret as another key")
            names.add(key.name)
            digests.add(key.digest_hex())
        return value

    @field_validator("channels")
    @classmethod
    def _channel_names_unique(cls, value: list[ChannelConfig]) -> list[ChannelConfig]:
        seen: set[str] = set()
        for channel in value:
            if channel.name in seen:
                raise ValueError(f"channel name {channel.name!r} is used twice")
            seen.add(channel.name)
        return value


def worker_count(config: GatewayConfig) -> int:
    """`server.workers`, or when unset: every usable core with shared (Redis) state, one without
    (the memory backend is per process, so a second worker would split limits and affinity)."""
    if config.server.workers is not None:
        return config.server.workers
    if config.state.backend == "memory":
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _is_http_url(value: str) -> bool:
    return bool(re.match(r"^https?://[^\s/?#]+(/[^\s?#]*)?$", value))
