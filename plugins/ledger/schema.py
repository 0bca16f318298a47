"""The ledger's tables in PostgreSQL, created and migrated by the gateway itself
(proxy/state/postgres.py). A database migrated by a newer release is left alone, and the ledger
says so and spools.
"""

from __future__ import annotations

from typing import Any

from proxy.state.postgres import Schema

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
    # 3: one request's story for the console (its time split, its trace, its attempts, the error
    # code the gateway answered), and an index for each search the console offers: the newest
    # rows of a model, route, status or client id, found without reading the others.
    """
    ALTER TABLE usage_records
        ADD COLUMN gateway_ms double precision,
        ADD COLUMN upstream_ms double precision,
        ADD COLUMN trace_id text,
        ADD COLUMN attempts integer,
        ADD COLUMN error_code text;
    CREATE INDEX usage_records_model_at ON usage_records (model, at);
    CREATE INDEX usage_records_route_at ON usage_records (route, at);
    CREATE INDEX usage_records_status_at ON usage_records (status, at);
    CREATE INDEX usage_records_client_request_id ON usage_records (client_request_id) WHERE client_request_id IS NOT NULL;
    """,
)


SCHEMA = Schema("the ledger's schema", "modelgate_ledger_schema", _LOCK, MIGRATIONS)


async def migrate(connection: Any) -> int:
    """Bring the ledger's schema up to date; the version it is at after."""
    return await SCHEMA.migrate(connection)
