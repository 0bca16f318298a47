"""A budget's refusals, in the endpoint's own shape: one that has no room left for a request, and
one a request could never fit."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from aiohttp import web

from plugins.budget.counters import Window
from proxy.core.exchange import Exchange


def refusal(ex: Exchange, subject: str, window: Window, used: float, asked: float, now: datetime) -> web.StreamResponse:
    """A request the budget has no room left for: when it resets, and what is left."""
    resets = datetime.fromtimestamp(window.resets_at, timezone.utc).isoformat().replace("+00:00", "Z")
    retry = max(1, math.ceil(window.resets_at - now.timestamp()))
    tokens = window.name.endswith("tokens")
    left = max(0.0, window.limit - used)
    state = (
        "reached"
        if left <= 0
        else (f"has {_amount(left, tokens)} left, less than this request may spend ({_amount(asked, tokens)})")
    )
    # A wait of hours is no retry: the SDKs that would sleep out a long Retry-After are told not to.
    return ex.error_response(
        429,
        f"budget '{window.name}' of {subject} ({_budget(window)}) {state}; it resets at {resets}",
        "budget_exceeded",
        headers={"Retry-After": str(retry), "x-should-retry": "false"},
    )


def never_fits(ex: Exchange, subject: str, window: Window, asked: float) -> web.StreamResponse:
    """A request whose most exceeds a whole budget: no wait makes room for it."""
    tokens = window.name.endswith("tokens")
    field = ".".join(ex.format.output_field[0]) if ex.format.output_field and tokens else None
    return ex.error_response(
        429,
        f"this request may spend up to {_amount(asked, tokens)}"
        f"{' tokens' if tokens else ''}, more than the whole budget '{window.name}' of "
        f"{subject} ({_budget(window)}): ask for {ex.format.asking_less}",
        "budget_exceeded",
        headers={"x-should-retry": "false"},
        param=field,
    )


def _amount(value: float, tokens: bool) -> str:
    """A budget's figure as a person reads it: whole tokens, or a cost without an exponent."""
    return f"{value:.0f}" if tokens else (f"{value:.9f}".rstrip("0").rstrip(".") or "0")


def _budget(window: Window) -> str:
    tokens = window.name.endswith("tokens")
    unit = "tokens" if tokens else "in cost"
    return f"{_amount(window.limit, tokens)} {unit} a {window.name.split('-')[1]}"
