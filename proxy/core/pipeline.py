"""`Pipeline`: the plugins of one route, run hook by hook (the contract is proxy/core/plugin.py;
finding plugins and checking a pipeline, proxy/registry.py). Each hook runs as a `phase` of the
request: a span of its own when the request is traced."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from proxy.core.exchange import Exchange
from proxy.core.phase import phase
from proxy.core.plugin import Plugin
from proxy.core.upstream_response import UpstreamResponse

if TYPE_CHECKING:
    from proxy.wire.sse import SSEEvent

log = logging.getLogger("modelgate.pipeline")


@dataclass(slots=True, frozen=True)
class Hook:
    """One plugin's implementation of one hook in a pipeline, and the name its phase goes by."""

    plugin: Plugin
    call: Callable[..., Any]
    phase: str  # "<plugin> <hook>": its span's name when the request is traced


class Pipeline:
    """The plugins of one route, with each hook list holding only real implementations: a hook a
    plugin does not override, or declared idle for this config (`Plugin.idle`), is not in it."""

    __slots__ = (
        "plugins",
        "prefetch_hooks",
        "request_hooks",
        "owner_check_at",
        "upstream_hooks",
        "response_hooks",
        "reads_answers",
        "event_hooks",
        "complete_hooks",
        "complete_checks",
        "stops",
        "_without",
    )

    def __init__(self, plugins: list[Plugin]) -> None:
        self.plugins = plugins
        self.prefetch_hooks = _implemented(plugins, "prefetch")
        self.request_hooks = _implemented(plugins, "on_request")
        # Where the core checks that a followed id is the caller's: before the first plugin that
        # may read what belongs to it, else after them all (and always before a channel is chosen).
        self.owner_check_at = next(
            (i for i, hook in enumerate(self.request_hooks) if not hook.plugin.before_owner_check),
            len(self.request_hooks),
        )
        self.upstream_hooks = _implemented(plugins, "on_upstream")
        self.response_hooks = _implemented(plugins, "on_response")
        self.reads_answers = any(hook.plugin.reads_answers for hook in self.response_hooks)
        self.event_hooks = _implemented(plugins, "on_event")
        self.complete_hooks = _implemented(plugins, "on_complete")
        # Each hook's `completes` where its plugin has one of its own (None: the list is used whole).
        checks = [
            hook.plugin.completes if type(hook.plugin).completes is not Plugin.completes else None
            for hook in self.complete_hooks
        ]
        self.complete_checks = checks if any(checks) else None
        # What the core does before an on_request beside calling it, by the hook's index: the owner
        # check (True) and asking its plugin whether it takes the exchange (Plugin.takes): one
        # lookup a hook finds both.
        self.stops: dict[int, tuple[bool, Plugin | None]] = {self.owner_check_at: (True, None)}
        for index, hook in enumerate(self.request_hooks):
            if type(hook.plugin).takes is not Plugin.takes:
                self.stops[index] = (index == self.owner_check_at, hook.plugin)
        self._without: dict[Plugin, Pipeline] = {}

    def without(self, plugin: Plugin) -> Pipeline:
        """This pipeline but for `plugin`: what an exchange that plugin does not take runs on. Made
        once per plugin left out (a handful at most: only plugins with a `takes` are)."""
        narrowed = self._without.get(plugin)
        if narrowed is None:
            narrowed = self._without[plugin] = Pipeline([other for other in self.plugins if other is not plugin])
        return narrowed

    def run_prefetch(self, ex: Exchange) -> None:
        for hook in self.prefetch_hooks:
            hook.call(ex)

    async def run_request(
        self, ex: Exchange, check_owner: Callable[[Exchange], Awaitable[web.StreamResponse | None]]
    ) -> web.StreamResponse | None:
        """The plugins' on_request hooks, and the core's `check_owner` at its place among them;
        the first answer ends it. A plugin that does not take the exchange is passed over, and
        `ex.pipeline` narrowed to the pipeline without it, which runs the exchange's later hooks."""
        stops = self.stops
        for index, hook in enumerate(self.request_hooks):
            if index in stops:
                owner_check, asked = stops[index]
                if owner_check and ex.follow_lookup is not None and (answer := await check_owner(ex)) is not None:
                    return answer
                if asked is not None and not asked.takes(ex):
                    ex.pipeline = (ex.pipeline or self).without(asked)
                    continue
            with phase(ex, hook.phase) as span:
                # A plain function's answer is the answer; a coroutine's (or any awaitable a
                # plain function hands back) is awaited first.
                answer = hook.call(ex)
                if answer is not None and inspect.isawaitable(answer):
                    answer = await answer
                if answer is not None and not isinstance(answer, web.StreamResponse):
                    # Not passed over: a check that meant to refuse must not let the request through.
                    raise TypeError(f"{hook.phase} answered with {type(answer).__name__}, not a response")
                if answer is not None and span is not None:
                    span.set_attribute("modelgate.short_circuit_status", answer.status)
            if answer is not None:
                return answer
        if self.owner_check_at == len(self.request_hooks) and ex.follow_lookup is not None:
            return await check_owner(ex)
        return None

    async def run_upstream(self, ex: Exchange) -> None:
        for hook in self.upstream_hooks:
            with phase(ex, hook.phase):
                # What a coroutine's or an awaitable handed back holds is awaited; other values
                # are none of the core's (as an async hook's returned value never was).
                if (pending := hook.call(ex)) is not None and inspect.isawaitable(pending):
                    await pending

    async def run_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        for hook in self.response_hooks:
            with phase(ex, hook.phase):
                if (pending := hook.call(ex, upstream)) is not None and inspect.isawaitable(pending):
                    await pending

    def run_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        for hook in self.event_hooks:
            event = hook.call(ex, event)
            if event is None:
                return None
        return event

    async def run_complete(self, ex: Exchange) -> None:
        """The plugins' on_complete hooks, together: their first state calls (a settlement, a
        budget's, the ledger's journal append) are made in one turn, so they share one round trip.

        Bookkeeping is never cut short: a client that leaves meanwhile (its handler cancelled)
        would otherwise leave a settlement half made, or a claim taken and never settled. Each
        hook's own calls are bounded (a state store waited on for at most half a second), so a
        drain that runs out waits that long at most."""
        hooks = self.complete_hooks
        if self.complete_checks is not None:  # hooks with nothing to do for this exchange are not run
            hooks = [hook for hook, wants in zip(hooks, self.complete_checks) if wants is None or wants(ex)]
        if not hooks:
            return
        # All as tasks, started together: their first calls come in the next turn, in one pipeline.
        # Waited on as one (a shield each cost a future and two callbacks per hook).
        loop = asyncio.get_running_loop()
        running = [loop.create_task(_complete(hook, ex)) for hook in hooks]
        together = running[0] if len(running) == 1 else asyncio.gather(*running)  # _complete raises nothing
        cancelled = 0
        while not together.done():
            try:
                await asyncio.shield(together)
            except asyncio.CancelledError:
                cancelled += 1  # the handler's, not the hooks': they go on
        current = asyncio.current_task()
        for _ in range(cancelled if current is not None else 0):  # the answer is over: nothing left to stop
            current.uncancel()  # type: ignore[union-attr]


async def _complete(hook: Hook, ex: Exchange) -> None:
    try:
        with phase(ex, hook.phase):
            if (pending := hook.call(ex)) is not None and inspect.isawaitable(pending):  # (a plain one's is done)
                await pending
    except Exception:  # one plugin's bookkeeping must not hide the others'
        log.exception("on_complete hook failed", extra={"request_id": ex.request_id})


def plugin_name(plugin: Plugin) -> str:
    """What a plugin's spans and logs call it: its registered name, else its class's."""
    name = getattr(plugin, "name", None)
    return name if isinstance(name, str) and name != "plugin" else type(plugin).__name__


def _implemented(plugins: list[Plugin], hook: str) -> list[Hook]:
    found = []
    for plugin in plugins:
        if hook in plugin.idle_hooks:  # declared idle for this config (Plugin.idle)
            continue
        if getattr(type(plugin), hook, None) is getattr(Plugin, hook):
            continue  # the base class's no-op
        found.append(Hook(plugin, getattr(plugin, hook), f"{plugin_name(plugin)} {hook}"))
    return found
