"""`Plugin`: the contract between the core and every plugin, built-in or third-party.

A plugin implements any of six hooks. `prefetch` runs first, before any `on_request`, and only
starts (as tasks, never awaited there) the state reads the plugin will need, so they ride the
request's first round trip to the state store; what it reads of an id the request follows must
wait, unused, for the core's check that the id is the caller's. `on_request` may answer the request itself
(an error in the endpoint's shape, say) and so end the pipeline; `on_upstream` runs once the
channel is chosen, the last chance to shape what that channel is sent; `on_response` sees a
buffered upstream answer; `on_event` sees each SSE event and returns the event to send
(the same one, a new one, or None to drop it); `on_complete` runs once at the end,
whatever happened. Only hooks a plugin really implements are called. A hook may be a plain
function when it never waits (a check of what the request holds): the core then makes no
coroutine for it; whatever a hook returns that is awaitable is awaited.

Beside its hooks a plugin declares, as class attributes the core reads without knowing the
plugin: what it `provides` to the plugins after it and what it `requires` of the ones before it
(checked whenever a pipeline is built, config or default), whether it may run before the core
has checked that an id the request follows is its caller's (`before_owner_check`), which routes it `joins` by default
and where (`order`), the settings it takes (`Settings`, and `KeySettings` on each key), and
what it adds to the gateway around the pipeline: `routes` the app serves (`admin_routes` for
operators only), `commands` the CLI runs, `config_problems` only the whole config shows. The core
finds plugins through the `modelgate.plugins` entry points (the built-in ones are registered like any other) or a
dotted path named in config.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web
from pydantic import BaseModel

from proxy.core.exchange import Exchange
from proxy.core.upstream_response import UpstreamResponse

if TYPE_CHECKING:
    from proxy.config import GatewayConfig
    from proxy.policy.channels import ChannelSet
    from proxy.wire.routes import Route
    from proxy.wire.sse import SSEEvent


# The gateway's resource holding its state store probe's verdict (a callable; absent: no probe).
STATE_REACHABLE = "state.reachable"
# The gateway's own state store, the one its affinity pins ids in (a callable returning it: the
# gateway closes it, after the plugins). A plugin keeping state beside the pins uses it, so its
# writes can go with a pin (`Exchange.with_pin`).
STATE_STORE = "state.store"
# Keys managed at run time (proxy/keystore/directory.py: a StoredKeyLookup; absent: no key store).
# The auth plugin finds a presented key there after the config's keys.
STORED_KEYS = "keys.stored"
# Tenants managed at run time, with their limits and plugins' tenant fields (a StoredTenantLookup;
# absent: no key store): a plugin that holds something for a tenant finds its settings there.
STORED_TENANTS = "tenants.stored"


# What `Plugin.query` may be asked: the requests recorded (newest first, filtered by `key`,
# `tenant`, `model`, `route`, `status`, `since`, `until`, `request_id`; `limit`, and `before`
# from the last page's `next`), one of them (`id`), and spend summed `by` key, tenant, model or
# day over a span.
QUERIES = ("requests", "request", "spend")


class QueryProblem(ValueError):
    """A query parameter a plugin cannot take: its name, and why (said to the caller as a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(slots=True, frozen=True)
class Subject:
    """Whom the admin API asks a plugin about (`Plugin.report`): a key (`key` set; `tenant` its
    owner, `tenant:NAME` or `key:NAME`, as `GatewayKey.tenant`) or a tenant (`key` None)."""

    name: str
    tenant: str
    key: Any = None  # the GatewayKey, for a key


@dataclass(slots=True, frozen=True)
class Capability:
    """What one plugin sets on the exchange for the ones after it, and the routes it can exist on
    (a requirement is void where it cannot: the account routes have no caller)."""

    described: str
    exists_on: Callable[[Route], bool]


CAPABILITIES: dict[str, Capability] = {
    "caller": Capability("the caller's identity (the gateway key, its name and tenant)", lambda route: route.takes_key),
    # What the upstream said an answer cost (and of a generation that outlived it), as read from
    # a whole answer and from a stream's events: without them every answer is charged its most.
    "answer usage": Capability(
        "the usage read from whole answers",
        lambda route: route.format.reports_usage and route.metered and not route.always_streams,
    ),
    "stream usage": Capability(
        "the usage read from stream events", lambda route: route.format.reports_usage and route.metered
    ),
}


@dataclass(slots=True, frozen=True)
class Joins:
    """The routes a plugin joins when config names no pipeline: every criterion given must hold
    (none given: every route)."""

    routes: frozenset[str] | None = None  # by name
    formats: frozenset[str] | None = None  # by wire format
    keyed: bool | None = None  # routes that read a gateway key
    local: bool | None = None  # routes the gateway answers itself
    endpoint: bool | None = None  # the spec's 13 endpoints, not the calls SDKs make around them
    usage: bool | None = None  # formats whose answers report token usage
    metered: bool | None = None  # the endpoints, and the calls that read what they made (Route.metered)

    def __call__(self, route: Route) -> bool:
        return (
            (self.routes is None or route.name in self.routes)
            and (self.formats is None or route.format.name in self.formats)
            and (self.keyed is None or route.takes_key == self.keyed)
            and (self.local is None or route.local == self.local)
            and (self.endpoint is None or (route.number > 0) == self.endpoint)
            and (self.usage is None or route.format.reports_usage == self.usage)
            and (self.metered is None or route.metered == self.metered)
        )


@dataclass(slots=True, frozen=True)
class PluginRoute:
    """A path the app serves for a plugin, beside the endpoints; the handler gets the running
    gateway's `resources`, where the plugin's live instance left what it serves with."""

    method: str
    path: str
    handler: Callable[[web.Request, Mapping[str, Any]], Awaitable[web.StreamResponse]]


@dataclass(slots=True, frozen=True)
class PluginCommand:
    """A `modelgate` subcommand a plugin adds: `arguments` fills its parser; `run` gets the
    loaded config and the parsed arguments and returns the exit status."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[GatewayConfig, argparse.Namespace], int]


class Plugin:
    """Base class for plugins; every hook and every declaration is optional."""

    name: ClassVar[str] = "plugin"
    Settings: ClassVar[type[BaseModel] | None] = None  # `plugins.<name>`, validated by check-config
    KeySettings: ClassVar[type[BaseModel] | None] = None  # fields this plugin reads on each `keys[]` entry
    TenantSettings: ClassVar[type[BaseModel] | None] = None  # fields it reads on a stored tenant (the key store)
    provides: ClassVar[frozenset[str]] = frozenset()  # capabilities set on the exchange (CAPABILITIES)
    requires: ClassVar[frozenset[str]] = frozenset()  # capabilities an earlier plugin must provide
    uses: ClassVar[frozenset[str]] = frozenset()  # ... that a plugin anywhere in the pipeline must (read at the end)
    joins: ClassVar[Joins | None] = None  # the default pipelines it is in (None: none)
    order: ClassVar[int] = 500  # its place in them: lower runs first
    # The core checks that an id a request follows is its caller's tenant's just before the first
    # on_request of a plugin not declared `before_owner_check` (else after them all): a plugin
    # sees another tenant's id only if it says it reads nothing that belongs to the id (auth,
    # validation, the limits). Running them first lets the id's lookup share their round trip.
    before_owner_check: ClassVar[bool] = False
    # Whether its on_response makes the relay read answers whole (False: it sees only the answers
    # read whole for another reason, and the others pass as bytes, unheld).
    reads_answers: ClassVar[bool] = True
    # Hooks an instance declared it has nothing to do on (`idle`), read when pipelines are built.
    idle_hooks: frozenset[str] = frozenset()

    @classmethod
    def routes(cls) -> Sequence[PluginRoute]:
        return ()

    @classmethod
    def admin_routes(cls) -> Sequence[PluginRoute]:
        """Paths for operators only: served on the admin listener, and on the main one only to the
        admin token (proxy/process/admin.py)."""
        return ()

    @classmethod
    def commands(cls) -> Sequence[PluginCommand]:
        return ()

    @classmethod
    def config_problems(cls, config: GatewayConfig, workers: int) -> list[str]:
        """Problems with this plugin's settings that only the whole config shows (`workers`: how
        many processes will serve it), each starting with its key path."""
        return []

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings
        # Objects that outlive a config reload, owned by the running gateway (set before configure).
        self.resources: dict[str, Any] = {}
        # The running config's channels, for a plugin that talks to upstreams itself (set before start).
        self.channels: ChannelSet | None = None

    def configure(self, config: GatewayConfig) -> None:
        """Called once with the whole config this instance serves (keys, channels ...). A plugin
        the config gives nothing to do on some hooks says so here, with `idle`."""

    def idle(self, *hooks: str) -> None:
        """This instance has nothing to do on `hooks` (`on_event`, ...): the core, which builds a
        route's hook lists after `configure`, leaves them out. A plugin off by default (no
        database, no budget named) thus costs no call per request, nor per stream event."""
        self.idle_hooks = self.idle_hooks | frozenset(hooks)

    async def start(self) -> None:
        """Called once before the first request (open connections, load state)."""

    async def stop(self) -> None:
        """Called once after the last request of the config this instance belongs to."""

    def prefetch(self, ex: Exchange) -> None:
        """Start the state reads this request will need (see the module's text); never await here."""

    def state_away(self) -> bool:
        """The shared state store's probe calls it away: a plugin that talks to the same store
        skips it (or its fail mode decides at once) rather than waiting on its timeouts."""
        reachable = self.resources.get(STATE_REACHABLE)
        return reachable is not None and not reachable()

    def unready(self, state_ok: bool) -> str | None:
        """Why this instance cannot serve right now, as far as this plugin knows (`/readyz` says
        so and answers 503), or None; `state_ok`: the state store answers its probe. A plugin
        whose configured fail mode serves on says None."""
        return None

    async def report(self, subject: Subject) -> dict[str, Any] | None:
        """What this plugin knows of a key or a tenant now (what it spent, what is left of its
        budget), for the admin API's usage reads: a JSON-ready dict, or None when it keeps nothing
        of them. Read only; off the request path."""
        return None

    async def query(self, name: str, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any] | None:
        """An admin read over what this plugin records, by `name` (QUERIES), for the admin API and
        the console: `tenant` (`tenant:NAME`, as `GatewayKey.tenant`) confines it to one tenant's
        records, whatever `params` ask. A JSON-ready dict, or None when this plugin keeps no such
        records; QueryProblem for a parameter it cannot take. Read only; off the request path."""
        return None

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        return None

    async def on_upstream(self, ex: Exchange) -> None:
        return None

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        return None

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        return event

    async def on_complete(self, ex: Exchange) -> None:
        return None

    def takes(self, ex: Exchange) -> bool:
        """Whether this exchange is any of this plugin's business. Asked once, just before its
        on_request (the plugins before it have run: the caller is known); False: none of its hooks
        run for the exchange, from that on_request to its on_complete (its `prefetch`, run before
        the caller is known, has run already). A plugin that is needed only for some callers
        (those with a budget) thus costs them a call, and the others no coroutine per hook. The
        base class's: always (and never asked); a plugin without an on_request is never asked
        either."""
        return True

    def completes(self, ex: Exchange) -> bool:
        """Whether `on_complete` has anything to do for this exchange. A plugin that can tell
        cheaply that it has not (it held nothing for the request) says so, and its hook is not
        run as a task for it; the base class's: always."""
        return True
