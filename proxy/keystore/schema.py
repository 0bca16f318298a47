"""The key store's tables in PostgreSQL, created and migrated by the gateway itself
(proxy/state/postgres.py); a database migrated by a newer release is left alone (the admin API
then answers 503, and the keys each process already holds keep working).

Every change to a key, a tenant or an admin token takes the next `revision` from one sequence,
so a process that has seen revision N reads what changed since with one query; a deleted row
stays, marked `deleted_at`, so that query sees deletions too (its name may be taken again).
"""

from __future__ import annotations

from proxy.state.postgres import Schema

_LOCK = 0x6D676B73  # 'mgks': the advisory lock the migrations take
CHANNEL = "modelgate_key_store"  # the NOTIFY channel: its payload is the revision just committed

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE SEQUENCE key_store_revision;
    CREATE TABLE tenants (
        name text NOT NULL,
        labels jsonb NOT NULL DEFAULT '{}',
        revision bigint NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        created_by text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        updated_by text NOT NULL,
        deleted_at timestamptz
    );
    CREATE UNIQUE INDEX tenants_name ON tenants (name) WHERE deleted_at IS NULL;
    CREATE INDEX tenants_revision ON tenants (revision);
    CREATE TABLE stored_keys (
        id bigserial PRIMARY KEY,
        name text NOT NULL,
        sha256 bytea NOT NULL,
        previous_sha256 bytea,
        previous_until timestamptz,
        tenant text,
        spec jsonb NOT NULL,
        idempotency_key text,
        revision bigint NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        created_by text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        updated_by text NOT NULL,
        deleted_at timestamptz
    );
    CREATE UNIQUE INDEX stored_keys_name ON stored_keys (name) WHERE deleted_at IS NULL;
    CREATE UNIQUE INDEX stored_keys_sha256 ON stored_keys (sha256);
    CREATE UNIQUE INDEX stored_keys_idempotency ON stored_keys (idempotency_key);
    CREATE INDEX stored_keys_revision ON stored_keys (revision);
    CREATE INDEX stored_keys_tenant ON stored_keys (tenant) WHERE deleted_at IS NULL;
    CREATE TABLE admin_tokens (
        id bigserial PRIMARY KEY,
        name text NOT NULL,
        sha256 bytea NOT NULL UNIQUE,
        role text NOT NULL,
        tenant text,
        expires_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        created_by text NOT NULL,
        deleted_at timestamptz
    );
    CREATE UNIQUE INDEX admin_tokens_name ON admin_tokens (name) WHERE deleted_at IS NULL;
    CREATE TABLE audit_log (
        id bigserial PRIMARY KEY,
        at timestamptz NOT NULL DEFAULT clock_timestamp(),
        actor text NOT NULL,
        role text NOT NULL,
        tenant_scope text,
        action text NOT NULL,
        outcome text NOT NULL,
        target_kind text,
        target text,
        tenant text,
        before jsonb,
        after jsonb,
        source_ip text,
        request_id text
    );
    CREATE INDEX audit_log_at ON audit_log (at);
    CREATE INDEX audit_log_target ON audit_log (target_kind, target, at);
    CREATE INDEX audit_log_tenant ON audit_log (tenant, at);
    CREATE RULE audit_log_no_update AS ON UPDATE TO audit_log DO INSTEAD NOTHING;
    CREATE RULE audit_log_no_delete AS ON DELETE TO audit_log DO INSTEAD NOTHING;
    """,
    # 2: a tenant's own limits and plugins' fields (its budget), for every key of it together.
    """
    ALTER TABLE tenants ADD COLUMN spec jsonb NOT NULL DEFAULT '{}';
    """,
    # 3: the key the console signs its sessions with, one for every instance (a session made on
    # one is good on all of them), made by the first to need it.
    """
    CREATE TABLE console_secret (
        one boolean PRIMARY KEY DEFAULT true CHECK (one),
        secret bytea NOT NULL
    );
    """,
)


SCHEMA = Schema("the key store's schema", "modelgate_key_store_schema", _LOCK, MIGRATIONS)
