"""`plugins.ledger`: where the ledger writes, how it batches, and where it spools meanwhile."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.state.postgres import postgres_url


class LedgerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str | None = Field(default=None, repr=False)  # holds a password, often
    batch_size: int = Field(default=1000, ge=1, le=100_000)
    flush_interval_s: float = Field(default=1.0, gt=0, le=60)
    write_timeout_s: float = Field(default=3.0, gt=0, le=60)  # past it PostgreSQL counts as away: the batch is spooled
    spool_dir: str = "ledger-spool"
    spool_max_mb: float = Field(default=1024, gt=0)
    # With state in Redis, journal each record there before its answer ends, and spool there first
    # (any instance drains both).
    redis_spool: bool = True
    # How long a generation left running (a background response, a video task) waits, pending, for
    # a follow-up to read how it ended; a row nobody settles by then keeps what was held for it.
    pending_for_s: int = Field(default=7 * 86_400, ge=60)  # budgets hold what they reserved for it as long

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        return postgres_url(value)
