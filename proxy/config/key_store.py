"""`key_store:`: where keys, tenants and admin tokens managed at run time live (PostgreSQL), and
how each process keeps its copy of them current (proxy/keystore/).

    key_store:
      database_url: ${MODELGATE_DATABASE_URL}   # the ledger's database serves as well
      resync_s: 30                              # a full re-read now and then heals a missed notice

Off until `database_url` is set: the keys are then the config file's alone.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.state.postgres import postgres_url


class KeyStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    database_url: str | None = Field(default=None, repr=False)  # holds a password, often
    # Each process is told of a change at once (LISTEN/NOTIFY); this often it reads everything
    # changed since its last revision all the same, so a notice lost with a connection heals.
    resync_s: float = Field(default=30.0, ge=1, le=3600)
    # How long a call to the store may take before the admin API answers 503.
    timeout_s: float = Field(default=5.0, gt=0, le=60)

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        return postgres_url(value)
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (read for its check: a port that is no number raises)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ValueError("a PostgreSQL URL: postgresql://user:password@host:5432/database")
        return value
