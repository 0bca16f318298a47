"""The ledger's tables in PostgreSQL, created and migrated by the gateway itself
(proxy/state/postgres.py). A database migrated by a newer release is left alone, and the ledger
says so and spools.
"""

from __future__ import annotations

from typing import Any

from proxy.state.postgres import Schema

_LOCK = 0x6D676C64  # 'mgld': the advisory lock the migrations take

# The day rows' sums, in the order of plugins/ledger/report.py's SUMS, and how one statement's
# rows (each with a `sign`: 1 written, -1 taken back) add to them.
DAILY_SUMS = (
    "requests",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "images",
    "video_seconds",
    "cost",
    "pending_cost",
    "unpriced",
    "estimated",
    "client_aborted",
    "cut",
    "pending",
)
DAILY_KEY = "day, tenant, key_name, model, route, channel, status"
_SIGNED = (
    "sum(sign)",
    *(
        f"coalesce(sum(sign * {c}), 0)"
        for c in (
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
            "reasoning_tokens",
            "images",
            "video_seconds",
            "cost",
        )
    ),
    "coalesce(sum(sign * cost) FILTER (WHERE pending), 0)",
    *(
        f"coalesce(sum(sign) FILTER (WHERE {c}), 0)"
        for c in ("NOT priced AND model IS NOT NULL", "estimated", "client_aborted", "cut_by IS NOT NULL", "pending")
    ),
)


def _daily_upsert(changed: str) -> str:
    """Add the rows of `changed` to their days. In the order of the key, so that two writers'
    statements lock the day rows they share in one order, and never wait on each other in a circle."""
    return (
        f"INSERT INTO usage_daily AS d SELECT (at AT TIME ZONE 'UTC')::date, coalesce(tenant, ''), "
        f"coalesce(key_name, ''), coalesce(model, ''), route, coalesce(channel, ''), status, {', '.join(_SIGNED)} "
        f"FROM ({changed}) AS changed GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7 "
        f"ON CONFLICT ({DAILY_KEY}) DO UPDATE SET "
        f"{', '.join(f'{c} = d.{c} + EXCLUDED.{c}' for c in DAILY_SUMS)};"
    )


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
    # the gateway answered, code and message), and an index for each search the console offers:
    # the newest rows of a model, route, status or client id, found without reading the others.
    """
    ALTER TABLE usage_records
        ADD COLUMN gateway_ms double precision,
        ADD COLUMN upstream_ms double precision,
        ADD COLUMN trace_id text,
        ADD COLUMN attempts integer,
        ADD COLUMN error_code text,
        ADD COLUMN error text;
    CREATE INDEX usage_records_model_at ON usage_records (model, at);
    CREATE INDEX usage_records_route_at ON usage_records (route, at);
    CREATE INDEX usage_records_status_at ON usage_records (status, at);
    CREATE INDEX usage_records_client_request_id ON usage_records (client_request_id)
        WHERE client_request_id IS NOT NULL;
    """,
    # 4: spend by day, kept by the database itself as rows are written, settled or deleted (a
    # statement's rows at once, from its transition tables), so a month's spend is read from a few
    # thousand rows, not a million. Empty text stands for "none" in its key columns (a unique
    # key treats NULLs as distinct). Filled from the rows already there.
    f"""
    CREATE TABLE usage_daily (
        day date NOT NULL,
        {", ".join(f"{c} text NOT NULL" for c in ("tenant", "key_name", "model", "route", "channel"))},
        status integer NOT NULL,
        requests bigint NOT NULL,
        {", ".join(f"{c} numeric NOT NULL" for c in DAILY_SUMS[1:])},
        PRIMARY KEY ({DAILY_KEY})
    );
    CREATE FUNCTION usage_daily_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            {_daily_upsert("SELECT *, 1 AS sign FROM new_rows")}
        ELSIF TG_OP = 'UPDATE' THEN
            {_daily_upsert("SELECT *, 1 AS sign FROM new_rows UNION ALL SELECT *, -1 AS sign FROM old_rows")}
        ELSE
            {_daily_upsert("SELECT *, -1 AS sign FROM old_rows")}
        END IF;
        RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER usage_daily_inserted AFTER INSERT ON usage_records REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_apply();
    CREATE TRIGGER usage_daily_updated AFTER UPDATE ON usage_records
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_apply();
    CREATE TRIGGER usage_daily_deleted AFTER DELETE ON usage_records REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_apply();
    {_daily_upsert("SELECT *, 1 AS sign FROM usage_records")}
    """,
    # 5: the format a translated request's upstream was asked in (none: the client's own).
    """
    ALTER TABLE usage_records ADD COLUMN upstream_format text;
    """,
)


SCHEMA = Schema("the ledger's schema", "modelgate_ledger_schema", _LOCK, MIGRATIONS)


async def migrate(connection: Any) -> int:
    """Bring the ledger's schema up to date; the version it is at after."""
    return await SCHEMA.migrate(connection)
