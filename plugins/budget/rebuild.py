"""Budget counters the state store lost, rebuilt from the usage ledger.

A counter starts at 0 when its period starts, and also when the store lost it (a Redis restarted
empty, a failover to a replica that never had it, a gateway with memory state started again). The
reservation that starts a counter says so; the gateway then adds what the ledger holds of that
subject and period from before that moment: what the requests of the period so far spent, which
the lost counter had counted. At the start of a period the ledger holds nothing of it, and nothing
is added. Requests in flight while the counter was lost may be counted in neither or both: the
rebuilt budget is right within those.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from plugins.budget.counters import Window


async def spent_before(database_url: str, subject: str, window: Window, before: float) -> float:
    """What the ledger holds of `subject` in `window`'s period, before `before` (unix time)."""
    import asyncpg

    who = ("key_name", subject.removeprefix("key:")) if subject.startswith("key:") else ("tenant", subject)
    measure = (
        "coalesce(sum(cost), 0)"
        if window.name.endswith("cost")
        else "coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0)"
    )
    connection: Any = await asyncpg.connect(database_url, timeout=5)
    try:
        found = await connection.fetchval(
            f"SELECT {measure} FROM usage_records WHERE {who[0]} = $1 AND at >= $2 AND at < $3",
            who[1],
            datetime.fromtimestamp(window.starts_at, timezone.utc),
            datetime.fromtimestamp(before, timezone.utc),
            timeout=10,
        )
    except asyncpg.UndefinedTableError:
        return 0.0  # a ledger that never wrote a record
    finally:
        await connection.close()
    return float(found)
