"""The ledger's tables in PostgreSQL, created and migrated by the gateway itself.

Each migration runs once, in order, inside one transaction with the version it brings, under an
advisory lock, so instances starting together migrate once. A database whose version is newer
than this release knows is left alone, and the ledger says so and spools (an older instance
during a rolling upgrade never writes into a shape it does not know).
"""

from __future__ import annotations

from typing import Any

_LOCK = 0x6D676C64  # 'mgld': the advisory lock the migrations take

MIGRATIONS: tuple[str, ...] = (
    # 1: one row per request; the gateway's request id makes a write idempotent.
    """
    CREATE TABLE usage_records (
        request_id text PRIMARY KEY,
        at timestamptz NOT NULL,
        client_request_id text,
        key_name text,
        tenant text,
        route text NOT NULL,
        model text,
        upstream_model text,
        channel text,
        status integer NOT NULL,
        input_tokens bigint,
        cached_input_tokens bigint,
        output_tokens bigint,
        reasoning_tokens bigint,
        images integer NOT NULL DEFAULT 0,
        video_seconds double precision NOT NULL DEFAULT 0,
        cost numeric(24, 12) NOT NULL DEFAULT 0,
        priced boolean NOT NULL,
        duration_ms double precision NOT NULL,
        client_aborted boolean NOT NULL,
        estimated boolean NOT NULL
    );
    CREATE INDEX usage_records_at ON usage_records (at);
    CREATE INDEX usage_records_key_at ON usage_records (key_name, at);
    CREATE INDEX usage_records_tenant_at ON usage_records (tenant, at);
    """,
    # 2: who cut an answer short; a generation that went on after its answer (pending until a
    # follow-up reads how it ended, then settled in place).
    """
    ALTER TABLE usage_records
        ADD COLUMN cut_by text,
        ADD COLUMN pending boolean NOT NULL DEFAULT false,
        ADD COLUMN settled_at timestamptz;
    CREATE INDEX usage_records_pending ON usage_records (at) WHERE pending;
    """,
)


class SchemaTooNew(Exception):
    """The database was migrated by a newer release."""


async def migrate(connection: Any) -> int:
    """Bring the schema up to date; the version it is at after."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        await connection.execute("CREATE TABLE IF NOT EXISTS modelgate_ledger_schema "
                                 "(version integer NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())")
        version = await connection.fetchval("SELECT coalesce(max(version), 0) FROM modelgate_ledger_schema")
        if version > len(MIGRATIONS):
            raise SchemaTooNew(f"the ledger's schema is at version {version}; this release knows {len(MIGRATIONS)}")
        for number in range(version + 1, len(MIGRATIONS) + 1):
            await connection.execute(MIGRATIONS[number - 1])
            await connection.execute("INSERT INTO modelgate_ledger_schema (version) VALUES ($1)", number)
        return len(MIGRATIONS)
