"""Rate limits per key, per key and model, per stored tenant (every key of it together), per route,
and per client IP on keyless routes.

Requests and tokens are counted over an exact sliding minute; concurrent requests hold a
lease until their answer ends or their client leaves (a whole answer read at once: until it is
read, just before it is sent). Tokens are reserved up front (the request's own maximum plus an
estimate of its input) and settled from the usage the upstream reports. A refusal is a 429 in
the endpoint's shape with Retry-After; limited routes carry RateLimit-Policy and RateLimit
headers. When the shared state is unreachable the configured mode holds: fail open (serve, count
it) or fail closed (503); what could not be settled then is settled once it is back.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import logging
import math
from typing import Any, Literal

from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.config import GatewayConfig
from proxy.config.model import Rates
from proxy.core.exchange import Exchange
from proxy.core.plugin import STORED_TENANTS, Joins, Plugin
from proxy.core.upstream_response import UpstreamResponse
from proxy.observability.metrics import child
from proxy.policy.prices import PriceTable
from proxy.ratelimits import Check, Kind, Limiter, LimiterUnavailable
from proxy.ratelimits.memory import MemoryLimiter
from proxy.request.charges import DEFAULT_OUTPUT_TOKENS, most_of
from proxy.wire.routes import ROUTE_NAMES

RATELIMIT_DECISIONS = Counter("modelgate_ratelimit_decisions", "Rate-limit decisions by policy", ["policy", "decision"])
RATELIMIT_BACKEND_ERRORS = Counter(
    "modelgate_ratelimit_backend_errors", "Limiter checks the shared state could not answer", ["mode"]
)

log = logging.getLogger("modelgate.ratelimit")
_WINDOW_S = 60.0
_SETTLING = "settling"
_FOUND = "found"  # the checks `takes` found, for on_request


class RateLimitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fail: Literal["open", "closed"] = "open"
    routes: dict[str, Rates] = Field(default_factory=dict)  # every client of a route together
    # The keyless routes: the login against brute force, the webhook against anyone filling its
    # queue (a payment provider sends from a few addresses; behind a proxy, see trusted_proxies).
    per_ip: dict[str, Rates] = Field(
        default_factory=lambda: {"login_2fa": Rates(rpm=10), "payment_webhook": Rates(rpm=600)}
    )
    trusted_proxies: list[str] = Field(default_factory=list)  # CIDRs whose X-Forwarded-For is believed
    default_reserve_tokens: int = Field(default=DEFAULT_OUTPUT_TOKENS, ge=1)

    @field_validator("routes", "per_ip")
    @classmethod
    def _route_names(cls, value: dict[str, Rates]) -> dict[str, Rates]:
        for name in value:
            if name not in ROUTE_NAMES:
                raise ValueError(f"{name!r} is not a route (one of {', '.join(ROUTE_NAMES)})")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value


class RateLimit(Plugin):
    name = "ratelimit"
    Settings = RateLimitSettings
    # Every route: the account routes take no key, so limits go by client IP there; elsewhere
    # they count by key, and without the caller would count every key as one IP's.
    joins = Joins()
    requires = frozenset({"caller"})
    order = 300
    before_owner_check = True  # reads nothing that belongs to a followed id
    reads_answers = False  # an answer read whole anyway is settled early; none is held for it

    def configure(self, config: GatewayConfig) -> None:
        settings: RateLimitSettings = self.settings
        self.proxies = [ipaddress.ip_network(c, strict=False) for c in settings.trusted_proxies]
        self.prices = PriceTable(config.prices)  # a model's own default output, when a request names no limit
        self.owns_limiter = config.state.backend == "redis"
        if self.owns_limiter:
            from proxy.ratelimits.redis import RedisLimiter

            self.limiter: Limiter = RedisLimiter(
                config.state.url, config.state.prefix, wait_s=config.state.check_timeout_s
            )
        else:
            # Kept by the running gateway, so a config reload does not forget who used what.
            self.limiter = self.resources.setdefault("ratelimit.memory", MemoryLimiter())  # type: ignore[assignment]
        self.unavailable = False
        self.stored_tenants = self.resources.get(STORED_TENANTS)  # tenants' limits made at run time

    async def stop(self) -> None:
        if self.owns_limiter:
            await self.limiter.close()

    def unready(self, state_ok: bool) -> str | None:
        if self.owns_limiter and not state_ok and self.settings.fail == "closed":  # its store is the state store
            return "rate limits cannot be checked and plugins.ratelimit.fail is closed"
        return None

    def _store_away(self) -> bool:
        """The shared store's probe says it is away: a Redis limiter is not waited on (a hung one
        would hold every request for its timeout); the fail mode decides at once."""
        return self.owns_limiter and self.state_away()

    def takes(self, ex: Exchange) -> bool:
        # A request no limit applies to (a key with none, of a tenant with none, on a route with no
        # per-address limit) runs none of its hooks: no lease, nothing to settle. The checks found
        # are kept for its on_request, which comes next.
        checks = self._checks(ex)
        if checks:
            ex.state(self)[_FOUND] = checks
        return bool(checks)

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        checks = ex.state(self).pop(_FOUND, None) or self._checks(ex)
        if not checks:
            return None
        try:
            if self._store_away():
                raise LimiterUnavailable("the state store is unreachable")
            decision = await self.limiter.acquire(checks, ex.gateway_id)
        except LimiterUnavailable as exc:
            return self._unavailable(ex, exc)
        if self.unavailable:
            self.unavailable = False
            log.warning("rate-limit state reachable again; limits apply")
        policy = ", ".join(
            f'"{c.policy}";q={c.limit};w={int(c.window_s)}' for c in checks if c.kind is not Kind.CONCURRENT
        )
        if not decision.allowed:
            assert decision.check is not None
            RATELIMIT_DECISIONS.labels(decision.check.policy, "limited").inc()
            retry = max(1, math.ceil(decision.retry_after_s))
            headers = {"Retry-After": str(retry), "RateLimit": f'"{decision.check.policy}";r=0;t={retry}'}
            if decision.check.kind is Kind.CONCURRENT:  # the header names it: so must the policy list
                lease = f'"{decision.check.policy}";q={decision.check.limit};qu="concurrent-requests"'
                policy = f"{policy}, {lease}" if policy else lease
            if policy:
                headers["RateLimit-Policy"] = policy
            return ex.error_response(
                429,
                f"rate limit '{decision.check.policy}' reached ({_describe(decision.check)}); retry in {retry}s",
                "rate_limited",
                headers=headers,
            )
        for check in checks:
            child(RATELIMIT_DECISIONS, check.policy, "allowed").inc()
        ex.state(self)["checks"] = checks
        if decision.check is not None and decision.check.kind is not Kind.CONCURRENT:
            ex.response_headers = {
                **(ex.response_headers or {}),
                "RateLimit-Policy": policy,
                "RateLimit": f'"{decision.check.policy}";r={decision.remaining};t={math.ceil(decision.reset_s)}',
            }
        return None

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        """A whole answer is here, and with it what the request cost. An answer that may write state
        of its own now (the pin of an id it hands out, an image stored for URL delivery, a video
        status cached) is settled now, so the call goes with those writes; a chat answer handing
        out no id, in on_complete, with the request's other
        bookkeeping (its budgets' settlement, its record's journal entry): one round trip, not two.
        The answer's body waits for that bookkeeping either way (proxy/request/relay.py)."""
        state = ex.state(self)
        checks: list[Check] | None = state.get("checks")
        if not checks or _SETTLING in state:
            return
        if not ex.usage.known and upstream.status < 400 and upstream.is_json:
            usage = ex.format.usage_from_body(upstream.json())  # the usage plugin, if any, reads it later
            if usage is not None:
                ex.usage.update(usage)
        if ex.route.creates is not None or not ex.format.reports_usage or ex.format.name == "images":
            state[_SETTLING] = asyncio.get_running_loop().create_task(self._settle(ex, checks))

    async def on_complete(self, ex: Exchange) -> None:
        state = ex.state(self)
        settling: asyncio.Task[None] | None = state.get(_SETTLING)
        if settling is not None:
            await settling
            return
        checks: list[Check] | None = state.get("checks")
        if checks:
            await self._settle(ex, checks)

    async def _settle(self, ex: Exchange, checks: list[Check]) -> None:
        """Tokens from what the request really cost, and its lease released; never raises."""
        reserved = next((c.cost for c in checks if c.kind is Kind.TOKENS), None)
        spent = _tokens_spent(ex, reserved) if reserved is not None else None
        tokens = None if spent == reserved else spent
        try:
            if self._store_away():  # not waited on: the limiter settles it once the store is back
                self.limiter.finish_later(checks, ex.gateway_id, tokens)
                raise LimiterUnavailable("the state store is unreachable")
            await self.limiter.finish(checks, ex.gateway_id, tokens)
        except LimiterUnavailable as exc:  # kept by the limiter, and made when the store is back
            RATELIMIT_BACKEND_ERRORS.labels(self.settings.fail).inc()
            log.warning("could not settle rate limits now (tried again every second): %s", exc)

    def _checks(self, ex: Exchange) -> list[Check]:
        settings: RateLimitSettings = self.settings
        route = ex.route.name
        checks: list[Check] = []
        key = ex.key
        if key is not None:
            limits = _key_limits(ex)
            if limits is not None:
                checks += self._rates(f"key:{key.name}", "key", limits, ex)
                if limits.concurrent:
                    checks.append(
                        Check(
                            f"key:{key.name}:concurrent",
                            "key-concurrent",
                            Kind.CONCURRENT,
                            limits.concurrent,
                            0,
                            subject=f"key:{key.name}",
                        )
                    )
                if ex.model is not None:
                    for pattern, rates in limits.models.items():
                        if fnmatch.fnmatchcase(ex.model, pattern):
                            checks += self._rates(f"key:{key.name}:model:{ex.model}", "key-model", rates, ex)
                            break
            tenant = (
                self.stored_tenants.tenant(key.tenant[7:])
                if self.stored_tenants is not None and key.tenant.startswith("tenant:")
                else None
            )
            if tenant is not None and tenant.limits is not None:  # every key of the tenant together
                checks += self._rates(key.tenant, "tenant", tenant.limits, ex)
                if tenant.limits.concurrent:
                    checks.append(
                        Check(
                            f"{key.tenant}:concurrent",
                            "tenant-concurrent",
                            Kind.CONCURRENT,
                            tenant.limits.concurrent,
                            0,
                            subject=key.tenant,
                        )
                    )
        if route in settings.routes:
            checks += self._rates(f"route:{route}", "route", settings.routes[route], ex)
        if ex.format.key_location.value == "none" and route in settings.per_ip:
            checks += self._rates(f"ip:{route}:{self._client_ip(ex)}", "ip", settings.per_ip[route], ex)
        return checks

    def _rates(self, base: str, scope: str, rates: Rates, ex: Exchange) -> list[Check]:
        found = []
        if rates.rpm:
            found.append(Check(f"{base}:rpm", f"{scope}-rpm", Kind.REQUESTS, rates.rpm, _WINDOW_S, subject=base))
        if rates.tpm and ex.route.spends_tokens:  # a token count, a status poll or a stored response costs none
            reserve = min(
                rates.tpm, most_of(ex, self.prices, self.settings.default_reserve_tokens, priced=False).tokens
            )
            found.append(Check(f"{base}:tpm", f"{scope}-tpm", Kind.TOKENS, rates.tpm, _WINDOW_S, reserve, base))
        return found

    def _client_ip(self, ex: Exchange) -> str:
        """The peer's address; behind a trusted proxy, the nearest X-Forwarded-For hop it did not add."""
        ip = ex.client_ip
        if not self.proxies or not _in(ip, self.proxies):
            return ip
        hops = [h.strip() for v in ex.request.headers.getall("X-Forwarded-For", ()) for h in v.split(",")]
        for hop in reversed(hops):
            if not _in(hop, self.proxies):
                return _address(hop) or ip  # a hop that is no address (junk a client sent) counts as the proxy
        return ip

    def _unavailable(self, ex: Exchange, exc: Exception) -> web.StreamResponse | None:
        mode = self.settings.fail
        RATELIMIT_BACKEND_ERRORS.labels(mode).inc()
        if not self.unavailable:
            self.unavailable = True
            log.warning("rate-limit state unreachable; failing %s: %s", mode, exc)
        if mode == "open":
            return None
        return ex.error_response(
            503,
            "rate limits cannot be checked right now; retry shortly",
            "rate_limiter_unavailable",
            headers={"Retry-After": "1"},
        )


def _key_limits(ex: Exchange) -> Any:
    config = ex.key.limits_config if ex.key is not None else None  # type: ignore[union-attr]
    if config is None or not (config.rpm or config.tpm or config.concurrent or config.models):
        return None
    return config


def _describe(check: Check) -> str:
    """The limit in words; for tokens, what this request asked of it (a reservation larger than
    what is left is refused however little the window has spent)."""
    if check.kind is Kind.CONCURRENT:
        return f"{check.limit} requests at once"
    if check.kind is Kind.REQUESTS:
        return f"{check.limit} requests per {int(check.window_s)}s"
    return (
        f"{check.limit} tokens per {int(check.window_s)}s; this request reserves {check.cost}: its own output "
        f"limit (the model's max_output_tokens in prices, or plugins.ratelimit.default_reserve_tokens, when it "
        f"names none) times the answers it asks for, plus its input"
    )


def _tokens_spent(ex: Exchange, reserved: int) -> int:
    """What the request really cost; each token check reserved the same amount (its own cap aside)."""
    usage = ex.usage
    if usage.known:
        return (usage.input_tokens or 0) + (usage.output_tokens or 0)
    if ex.outcome.upstream_headers_at is None:
        return 0  # the upstream never answered: nothing was spent
    return reserved  # an answer without a reported usage keeps its reservation


def _address(hop: str) -> str | None:
    """A hop as the address it names, written the one way (so '::1' and '0::1' are one subject), or None."""
    try:
        return str(ipaddress.ip_address(hop))
    except ValueError:
        return None


def _in(address: str, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)
