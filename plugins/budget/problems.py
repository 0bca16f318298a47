"""Budgets a config could never hold, as `check-config` says them: a cost budget with nothing
priced, a tenant budget no key belongs to, a budget some route's configured pipeline escapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.config import GatewayConfig
from proxy.registry import configured_without
from proxy.wire.routes import ROUTES

if TYPE_CHECKING:
    from proxy.core.plugin import Plugin


def budget_problems(config: GatewayConfig, cls: type[Plugin]) -> list[str]:
    settings = config.plugins.get(cls.name, {})
    tenants = settings.get("tenants", {}) if isinstance(settings, dict) else {}
    tenants = tenants if isinstance(tenants, dict) else {}
    problems = []
    costed = [f"keys[{i}].budget" for i, key in enumerate(config.keys) if _costs((key.model_extra or {}).get("budget"))]
    costed += [f"plugins.{cls.name}.tenants.{label}" for label, limits in tenants.items() if _costs(limits)]
    if costed and not config.prices:
        problems.append(
            f"{costed[0]}: a cost budget, and no prices: every request would cost 0 (add `prices`, docs/ledger.md)"
        )
    labels = {key.labels.get("tenant") for key in config.keys}
    if not config.key_store.database_url:  # with a key store, the tenant's keys may be stored ones
        problems += [
            f"plugins.{cls.name}.tenants.{label}: no key has the tenant label {label!r}"
            for label in tenants
            if label not in labels
        ]
    budgeted = [f"keys[{i}].budget" for i, key in enumerate(config.keys) if (key.model_extra or {}).get("budget")]
    budgeted += [f"plugins.{cls.name}.tenants.{label}" for label in tenants]
    if budgeted:  # a charged route escapes it; a follow-up without it never settles what a generation held
        metered = [route for route in ROUTES if route.metered and route.takes_key and not route.local]
        problems += [
            f"routes.{name}.plugins: leaves out {cls.name}, so {budgeted[0]} does not hold for its "
            f"requests (they are charged, or settled, nowhere): add {cls.name}"
            for name in configured_without(config, cls, metered)
        ]
    return problems


def _costs(limits: Any) -> bool:
    """Whether a budget as written names a cost (a key's fields are read by their model later)."""
    found = limits.model_dump() if hasattr(limits, "model_dump") else limits
    return isinstance(found, dict) and bool(found.get("cost_per_day") or found.get("cost_per_month"))
