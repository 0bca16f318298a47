"""Budgets: what a key, or every key of a tenant label, may spend a day and a month, in cost (by
the price table) or in tokens, exact across instances.

    keys: [{name: team-a, key: ..., budget: {cost_per_day: 50, tokens_per_month: 20000000}}]
    plugins: {budget: {tenants: {acme: {cost_per_month: 1000}}, soft_percent: 80}}

Before the upstream is called a charged request reserves the most it may spend
(proxy/request/charges.py: its output limit, or the model's default, times the answers it asks
for, plus its input; priced by the table) in each of its windows, and is refused with a 429
`budget_exceeded` saying when the budget resets when one has no room left for it (or could never
hold it); after the answer it settles what it really spent. A generation that goes on after its
answer (a background response, a video task) keeps its reservation until a follow-up reads how
it ended; follow-ups reserve nothing and are never refused here. Past `soft_percent` of a budget
answers carry `X-Budget-Warning`. Windows are calendar days and months in UTC.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Literal

from aiohttp import web
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from plugins.budget.counters import Counters, CountersUnavailable, MemoryCounters, Reserved, Window, windows_of
from plugins.budget.held import HELD_FOR_S, Held, Taken
from plugins.budget.late import LateCounts
from plugins.budget.problems import budget_problems
from plugins.budget.refusals import never_fits, refusal
from proxy.config import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.core.plugin import STORED_TENANTS, Joins, Plugin, Subject
from proxy.core.upstream_response import UpstreamResponse
from proxy.formats import Generation
from proxy.formats.images import ImagesFormat
from proxy.formats.video import VideoFormat
from proxy.observability.metrics import child
from proxy.policy.prices import PriceTable
from proxy.request.body import MultipartBody
from proxy.request.charges import DEFAULT_OUTPUT_TOKENS, Most, left_open, most_of, read_ended
from proxy.request.deciding_fields import settle_counts
from proxy.request.usage_estimate import usage_or_estimate
from proxy.schemas.common import Violation
from proxy.state import connect as topology
from proxy.wire.sse import SSEEvent

log = logging.getLogger("modelgate.budget")

BUDGET_USED = Gauge(
    "modelgate_budget_used_ratio",
    "Spent and reserved over the budget, by subject and window (key-day-cost ...), as last seen by a request",
    ["subject", "window"],
    multiprocess_mode="livemax",
)
BUDGET_REFUSALS = Counter(
    "modelgate_budget_refusals", "Requests refused for a budget with no room left", ["subject", "window"]
)
BUDGET_UNAVAILABLE = Counter(
    "modelgate_budget_backend_errors", "Budget checks the shared state could not answer", ["mode"]
)

_STATE = "reserved"
_UNCOUNTED = "uncounted"
_TENANT = "tenant:"  # how a key names the tenant it belongs to (GatewayKey.tenant), before its label
_IMAGES = "images"
_VIDEO_CREATES = frozenset({"video_generations", "videos"})
_SETTLED_HERE = 10_000  # ids of ended generations this process settled: not claimed again


class BudgetLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cost_per_day: float | None = Field(default=None, gt=0)
    cost_per_month: float | None = Field(default=None, gt=0)
    tokens_per_day: int | None = Field(default=None, ge=1)
    tokens_per_month: int | None = Field(default=None, ge=1)


class BudgetKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    budget: BudgetLimits | None = None


class BudgetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: dict[str, BudgetLimits] = Field(default_factory=dict)  # by tenant label: every key of it together
    soft_percent: float = Field(default=80, gt=0, le=100)
    # A counter the state store lost is rebuilt from the ledger (plugins.ledger.database_url), when there is one.
    rebuild_from_ledger: bool = True
    # A model no row of the price table prices costs nothing, so a cost budget cannot hold it:
    # refused (403 model_not_priced) for a subject with one, unless allowed.
    unpriced: Literal["refuse", "allow"] = "refuse"
    default_reserve_tokens: int = Field(default=DEFAULT_OUTPUT_TOKENS, ge=1)
    fail: Literal["open", "closed"] = "open"


class Budget(Plugin):
    name = "budget"
    Settings = BudgetSettings
    KeySettings = BudgetKey
    TenantSettings = BudgetKey  # a stored tenant's `budget`, for every key of it together
    # The keyed endpoints, where those that charge reserve, and the calls that read what a
    # generation made (status polls, a stored response, its cancel), which settle a charge it left open.
    joins = Joins(keyed=True, local=False, metered=True)
    requires = frozenset({"caller"})
    uses = frozenset({"answer usage", "stream usage"})  # what it settles by
    order = 310  # right after the rate limits
    before_owner_check = True  # reads nothing that belongs to a followed id
    reads_answers = False

    @classmethod
    def config_problems(cls, config: GatewayConfig, workers: int) -> list[str]:
        return budget_problems(config, cls)

    def configure(self, config: GatewayConfig) -> None:
        self.prices = PriceTable(config.prices)
        self.redis = config.state.backend == "redis"
        self.tagged = self.redis and topology.mode_of(config.state.url) is topology.Mode.CLUSTER
        self.prefix = config.state.prefix + "budget:"
        self.counters: Counters | None = None
        # Keys made at run time (key_store) may name a budget any time: with a key store, never idle.
        if (
            not self.settings.tenants
            and not config.key_store.database_url
            and not any((key.model_extra or {}).get("budget") for key in config.keys)
        ):
            self.idle("on_request", "on_event", "on_response", "on_complete")  # no budget named: nothing to hold
        elif self.redis:
            from plugins.budget.counters import RedisCounters

            self.counters = RedisCounters(config.state.url, config.state.check_timeout_s)
        else:
            self.counters = self.resources.setdefault("budget.memory", MemoryCounters())
        self.late = LateCounts(self.counters) if self.counters is not None else None
        self.stored_tenants = self.resources.get(STORED_TENANTS)  # tenants' budgets made at run time
        self.unavailable = False
        ledger = config.plugins.get("ledger")
        self.ledger_url = None
        if isinstance(ledger, dict) and self.settings.rebuild_from_ledger:
            self.ledger_url = ledger.get("database_url")
        # A held reservation waits for its settlement no longer than the ledger's pending row does,
        # so the two settle, or stay at what was held, together.
        self.held_for_s = int(ledger.get("pending_for_s", HELD_FOR_S) if isinstance(ledger, dict) else HELD_FOR_S)
        self._background: set[asyncio.Task[None]] = set()
        self._settled: dict[str, None] = {}  # oldest first

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self.late is not None:
            await self.late.close()
        if self.redis and self.counters is not None:
            await self.counters.close()

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        if not ex.route.spends_tokens:
            return None  # it reads what another request made: nothing to reserve, never refused
        subjects = self._subjects(ex)
        if not subjects:
            return None
        if self.settings.unpriced == "refuse" and ex.model is not None and self.prices.row_for(ex.model) is None:
            costed = [subject for subject, limits in subjects if limits.cost_per_day or limits.cost_per_month]
            if costed:
                return ex.error_response(
                    403,
                    f"{costed[0]} has a cost budget, and the price table prices no model named {ex.model[:100]!r}",
                    "model_not_priced",
                )
        settle_counts(ex)
        most = most_of(ex, self.prices, self.settings.default_reserve_tokens)
        now = datetime.now(timezone.utc)
        planned = []
        for subject, limits in subjects:
            windows = self._windows(subject, limits, now)
            amounts = [float(most.tokens) if w.name.endswith("tokens") else most.cost for w in windows]
            for window, amount in zip(windows, amounts):
                if amount > window.limit:  # no wait makes room for it; let through, it could spend past the budget
                    child(BUDGET_REFUSALS, subject, window.name).inc()
                    return never_fits(ex, subject, window, amount)
            planned.append((subject, windows, amounts))
        taken: Taken = []
        warnings = []
        skipped = self.redis and self.state_away()  # not asked at all: what it spends is counted once it is back
        under_way = False
        try:
            if skipped:
                raise CountersUnavailable("the state store is unreachable", unsent=True)
            for subject, windows, amounts in planned:
                reserving = asyncio.ensure_future(self.counters.reserve(windows, amounts))  # type: ignore[union-attr]
                try:
                    reserved = await asyncio.shield(reserving)
                except asyncio.CancelledError:  # the client left with this one under way: it goes back once made
                    under_way = True
                    self._in_background(self._give_back([*taken, (windows, amounts)], reserving), "budget give-back")
                    raise
                for window, used in zip(windows, reserved.used):
                    child(BUDGET_USED, subject, window.name).set(used / window.limit)
                    if reserved.refused is None and used / window.limit * 100 >= self.settings.soft_percent:
                        warnings.append(f"{window.name}={used / window.limit:.2f}")
                if reserved.refused is not None:
                    await self._give_back(taken)
                    index = windows.index(reserved.refused)
                    child(BUDGET_REFUSALS, subject, reserved.refused.name).inc()
                    return refusal(ex, subject, reserved.refused, reserved.used[index], amounts[index], now)
                taken.append((windows, amounts))
                if reserved.made and self.ledger_url is not None:
                    self._rebuild(subject, reserved.made, now.timestamp())
        except CountersUnavailable as exc:  # the fail mode decides
            await self._give_back(taken)
            # Not asked, or its reservation never went: counted once the store is back. (One that
            # went and timed out may still be made, late: it is not counted again.)
            if exc.unsent:
                ex.state(self)[_UNCOUNTED] = ([windows for _, windows, _ in planned], most)
            return self._unavailable(ex, exc)
        except asyncio.CancelledError:  # the client left: what was reserved goes back
            if not under_way:
                self._in_background(self._give_back(taken), "budget give-back")
            raise
        ex.state(self)[_STATE] = (taken, most)
        if isinstance(ex.body_stream, MultipartBody):  # a form may name what it asks for after its files
            ex.body_stream.gates.append(lambda: self._top_up(ex))
        if warnings:
            ex.response_headers = {**(ex.response_headers or {}), "X-Budget-Warning": ", ".join(warnings)}
        return None

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if ex.format.name == "images" and _STATE in ex.state(self) and (image := ImagesFormat.image_in_event(event)):
            ex.state(self).setdefault(_IMAGES, []).append(image)
        return event

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if _STATE in ex.state(self) and upstream.status < 400 and ex.format.name == "images" and upstream.is_json:
            ex.state(self)[_IMAGES] = ImagesFormat.images_made(upstream.json(), ex.asked())

    async def on_complete(self, ex: Exchange) -> None:
        if (uncounted := ex.state(self).pop(_UNCOUNTED, None)) is not None:  # served while the store was away
            subjects, most = uncounted
            tokens, cost = (most.tokens, most.cost) if left_open(ex) else self._spent(ex, most)
            assert self.late is not None  # (a budget named: not idle)
            for windows in subjects:
                self.late.count(windows, [float(tokens) if w.name.endswith("tokens") else cost for w in windows])
            return
        held = ex.state(self).pop(_STATE, None)
        if held is not None:
            taken, most = held
            if not taken:
                return
            if left_open(ex):  # it goes on: its reservation stays, until a follow-up reads how it ended
                await self._hold(ex, taken, most)
            else:
                await self._settle(taken, *self._spent(ex, most))
            return
        generation = read_ended(ex)
        if generation is not None and self.counters is not None:
            await self._settle_open(ex.followed_id, generation)  # type: ignore[arg-type]

    def takes(self, ex: Exchange) -> bool:
        # A caller with a budget, or a follow-up that may read the end of a generation one held
        # for (read_ended): a key with no budget, of a tenant with none, runs none of its hooks.
        key = ex.key
        if (
            key is not None
            and ex.route.spends_tokens
            and (
                key.settings.get("budget") is not None
                or key.tenant.startswith(_TENANT)
                and self._tenant_budget(key.tenant[len(_TENANT) :]) is not None
            )
        ):
            return True
        return ex.followed_id is not None and ex.route.creates is None

    def completes(self, ex: Exchange) -> bool:
        # A reservation made or left to count, or a follow-up that may read a generation's end
        # (read_ended): a key without a budget costs no task after its answer.
        state = ex.state(self)
        return _STATE in state or _UNCOUNTED in state or ex.followed_id is not None and ex.route.creates is None

    async def _top_up(self, ex: Exchange) -> Violation | None:
        """A form is whole, before its last chunk goes upstream: what it asks for after its files
        (`n`, `partial_images`, the seconds of a video) is reserved too, or the request refused
        (the upstream never has the whole of it)."""
        held = ex.state(self).get(_STATE)
        if held is None:
            return None
        taken, most = held
        final = most_of(ex, self.prices, self.settings.default_reserve_tokens)
        if final.tokens <= most.tokens and final.cost <= most.cost:
            return None
        before, more = list(taken), []
        refused: Violation | None = None
        try:
            for index, (windows, amounts) in enumerate(before):
                now_amounts = [float(final.tokens) if w.name.endswith("tokens") else final.cost for w in windows]
                if any(new > w.limit for w, new in zip(windows, now_amounts)):
                    refused = Violation(
                        "", "the form asks, after its files, for more than a whole budget holds", 429, "budget_exceeded"
                    )
                    break
                extras = [max(0.0, new - old) for new, old in zip(now_amounts, amounts)]
                reserved = await self.counters.reserve(windows, extras)  # type: ignore[union-attr]
                if reserved.refused is not None:
                    refused = Violation(
                        "",
                        f"budget '{reserved.refused.name}' has no room for what the form asks for after its files",
                        429,
                        "budget_exceeded",
                    )
                    break
                more.append((windows, extras))
                taken[index] = (windows, [a + e for a, e in zip(amounts, extras)])  # settled from all it holds
        except CountersUnavailable as exc:  # the fail mode decides, as for the first reservation (open:
            if self.settings.fail == "closed":  # what was topped up stays counted, and is settled)
                refused = Violation("", f"budgets cannot be checked: {exc}", 503, "budget_unavailable")
        if refused is not None:
            taken[:] = before  # what this request holds is what it held before
            await self._give_back(more)
            return refused
        ex.state(self)[_STATE] = (taken, final)
        return None

    async def _settle(self, taken: Taken, spent_tokens: int, spent_cost: float) -> None:
        try:
            for windows, amounts in taken:
                deltas = [
                    (spent_tokens if w.name.endswith("tokens") else spent_cost) - a for w, a in zip(windows, amounts)
                ]
                await self.counters.settle(windows, deltas)
        except CountersUnavailable as exc:  # what was reserved stays counted: a budget errs on the side of stopping
            log.warning("a budget settlement did not reach the store: %s", exc)

    async def _hold(self, ex: Exchange, taken: Taken, most: Most) -> None:
        """Keep what a generation left open reserved, and how to settle it, under the id handed out."""
        held = Held(ex.model, most, ex.format.reports_usage, taken)
        try:
            await self.counters.hold(
                self._held_key(ex.created_id),
                held.dumps(),  # type: ignore[union-attr, arg-type]
                held.ttl_s(datetime.now(timezone.utc).timestamp(), self.held_for_s),
            )
        except CountersUnavailable as exc:  # the reservation stays counted all the same: nothing is lost but a refund
            log.warning("a generation left running could not be recorded for its settlement: %s", exc)

    async def _settle_open(self, generation_id: str, generation: Generation) -> None:
        """A follow-up read how a generation left open ended: its reservation becomes what it spent,
        once, by whichever request claims it first."""
        if generation_id in self._settled:
            return
        try:
            raw = await self.counters.claim(self._held_key(generation_id))  # type: ignore[union-attr]
        except CountersUnavailable as exc:  # claimed by a later follow-up, or kept at its reservation
            log.warning("a generation's settlement could not be claimed: %s", exc)
            return
        if raw is None:  # settled already, never held (no budget then), not held yet, or held past its windows
            return
        self._settled[generation_id] = None  # settled here: later reads of it need not ask
        while len(self._settled) > _SETTLED_HERE:
            del self._settled[next(iter(self._settled))]
        held = Held.loads(raw)
        await self._settle(held.taken, *held.spent(generation, self.prices))

    def _held_key(self, generation_id: str) -> str:
        return f"{self.prefix}open:{generation_id}"

    def _subjects(self, ex: Exchange) -> list[tuple[str, BudgetLimits]]:
        return self._budgets_of(ex.key, ex.key.tenant) if ex.key is not None else []

    def _budgets_of(self, key: Any, tenant: str) -> list[tuple[str, BudgetLimits]]:
        """The budgets a request of `key` counts against (its own, its tenant's); `key` None: the
        tenant's alone."""
        found = []
        own = key.settings.get("budget") if key is not None else None
        if own is not None:
            found.append((f"key:{key.name}", own))
        if tenant.startswith(_TENANT) and (budget := self._tenant_budget(tenant[len(_TENANT) :])) is not None:
            found.append((tenant, budget))
        return found

    def _tenant_budget(self, label: str) -> BudgetLimits | None:
        """A tenant's budget: the config's word first (GitOps), then the key store's."""
        if label in self.settings.tenants:
            return self.settings.tenants[label]
        if self.stored_tenants is not None and (stored := self.stored_tenants.tenant(label)) is not None:
            return stored.settings.get("budget")
        return None

    async def report(self, subject: Subject) -> dict[str, Any] | None:
        """Each budget window of the key (and its tenant), or of the tenant: its limit, what is
        spent and reserved now, what is left and when it resets."""
        if self.counters is None:
            return None
        now = datetime.now(timezone.utc)
        windows = [
            window
            for name, limits in self._budgets_of(subject.key, subject.tenant)
            for window in self._windows(name, limits, now)
        ]
        if not windows:
            return {"windows": []}
        values: list[float] = []
        for subject_windows in _by_subject(windows):  # one read a subject: its windows share a slot
            try:
                values += await self.counters.read(subject_windows)
            except CountersUnavailable:
                return {"windows": [], "unavailable": "the state store does not answer"}
        return {
            "windows": [
                {
                    "name": window.name,
                    "limit": window.limit,
                    "spent": value,
                    "remaining": max(0.0, window.limit - value),
                    "resets_at": datetime.fromtimestamp(window.resets_at, timezone.utc).isoformat(),
                }
                for window, value in zip(windows, values)
            ]
        }

    def _windows(self, subject: str, limits: BudgetLimits, now: datetime) -> list[Window]:
        base = f"{self.prefix}{{{subject}}}" if self.tagged else f"{self.prefix}{subject}"
        return windows_of(base, subject.split(":", 1)[0], limits, now)

    def _spent(self, ex: Exchange, most: Most) -> tuple[int, float]:
        """What the request spent: the upstream's counts, estimated where it never said them (a
        stream cut short is settled by what it streamed, not left at what it reserved)."""
        if ex.outcome.upstream_started is None:
            return 0, 0.0  # never sent upstream
        usage, _ = usage_or_estimate(ex, most.usage)
        if ex.outcome.status >= 400 and not usage.known:
            return 0, 0.0  # refused or failed before a word: nothing an upstream bills
        made = ex.outcome.status < 400 and ex.route.name in _VIDEO_CREATES
        seconds = VideoFormat.seconds_made(ex.asked())[0] if made else 0.0
        charge = self.prices.charge(ex.model, usage, ex.state(self).get(_IMAGES, []), seconds)
        return (usage.input_tokens or 0) + (usage.output_tokens or 0), charge.cost

    def _rebuild(self, subject: str, windows: list[Window], before: float) -> None:
        """Add to counters this request started what the ledger knows of their periods (off the request path)."""

        async def run() -> None:
            from plugins.budget.rebuild import spent_before

            for window in windows:
                try:
                    spent = await spent_before(self.ledger_url, subject, window, before)  # type: ignore[arg-type]
                    if spent > 0:
                        await self.counters.add([window], [spent])
                        log.info(
                            "a budget counter the state store had lost is rebuilt from the ledger",
                            extra={"subject": subject, "window": window.name, "spent": spent},
                        )
                except Exception as exc:  # noqa: BLE001 (a ledger away: the counter goes on from what it has)
                    log.warning("a budget counter could not be rebuilt from the ledger: %s", type(exc).__name__)

        self._in_background(run(), "budget rebuild")

    def _in_background(self, work: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._background.add(task)  # referenced until done
        task.add_done_callback(self._background.discard)

    async def _give_back(self, taken: Taken, last: asyncio.Future[Reserved] | None = None) -> None:
        """Give back what `taken` reserved; its last one only once `last`, the reservation that was
        under way, is known to be made."""
        if last is not None:
            try:
                made = (await last).refused is None
            except CountersUnavailable:
                made = False  # timed out: it may run late, and then stays counted (errs on stopping)
            if not made:
                taken = taken[:-1]
        for windows, amounts in taken:
            try:
                await self.counters.settle(windows, [-a for a in amounts])
            except CountersUnavailable:  # kept counted: errs on the side of stopping
                log.warning("a budget reservation could not be given back")

    def _unavailable(self, ex: Exchange, exc: Exception) -> web.StreamResponse | None:
        mode = self.settings.fail
        BUDGET_UNAVAILABLE.labels(mode).inc()
        if not self.unavailable:
            self.unavailable = True
            log.warning("budgets cannot be checked; failing %s: %s", mode, type(exc).__name__)
        if mode == "open":
            return None
        return ex.error_response(
            503,
            "budgets cannot be checked right now; retry shortly",
            "budget_unavailable",
            headers={"Retry-After": "1"},
        )


def _by_subject(windows: list[Window]) -> list[list[Window]]:
    """Windows in runs of one subject (a key's, a tenant's), in order."""
    runs: list[list[Window]] = []
    for window in windows:
        if runs and runs[-1][0].key.rsplit(":", 2)[0] == window.key.rsplit(":", 2)[0]:
            runs[-1].append(window)
        else:
            runs.append([window])
    return runs
