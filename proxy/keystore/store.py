"""`KeyStore`: the key store's rows in PostgreSQL, read and changed.

Every change runs in one transaction that also takes the next revision, writes the audit entry
(who, which role, what, the record before and after, never a secret) and notifies every process
(`pg_notify`, delivered at commit): a change is seen with its audit entry or not at all.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

from proxy.keystore.records import Actor, StoredKey, Tenant, new_secret
from proxy.keystore.schema import CHANNEL, SCHEMA

_KEY_COLUMNS = (
    "name, sha256, previous_sha256, previous_until, tenant, spec, revision, created_at, created_by, "
    "updated_at, updated_by, deleted_at"
)
_TENANT_COLUMNS = "name, labels, created_at, created_by, updated_at, updated_by, spec"


class Conflict(Exception):
    """The change clashes with what is stored (a name taken, a tenant that does not exist)."""


class NotFound(Exception):
    pass


def _key(row: Any) -> StoredKey:
    return StoredKey(
        row["name"],
        bytes(row["sha256"]),
        bytes(row["previous_sha256"]) if row["previous_sha256"] is not None else None,
        row["previous_until"],
        row["tenant"],
        json.loads(row["spec"]),
        row["revision"],
        row["created_at"],
        row["created_by"],
        row["updated_at"],
        row["updated_by"],
        row["deleted_at"],
    )


def _tenant(row: Any) -> Tenant:
    return Tenant(
        row["name"],
        json.loads(row["labels"]),
        row["created_at"],
        row["created_by"],
        row["updated_at"],
        row["updated_by"],
        json.loads(row["spec"]),
    )


_WRITE_LOCK = 0x6D676B77  # 'mgkw': held by each change until it commits


class KeyStore:
    """The key store in one PostgreSQL database (`key_store.database_url`).

    Changes are made one at a time (a transaction-level advisory lock, taken before the revision
    is), so revisions commit in the order they are taken: a process that has read revision N has
    seen every change before it. (Two changes committing out of order would let a reader move past
    the first for good: a revoked key serving on.)"""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._pool: Any = None

    async def open(self) -> None:
        """Connect and migrate (OSError, asyncpg's errors or SchemaTooNew when it cannot)."""
        import asyncpg

        if self._pool is None:
            pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=4, timeout=self.timeout_s, command_timeout=self.timeout_s
            )
            try:
                async with pool.acquire() as connection:
                    await SCHEMA.migrate(connection)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _acquire(self) -> Any:
        await self.open()
        return self._pool.acquire()

    @contextlib.asynccontextmanager
    async def _change(self) -> AsyncIterator[Any]:
        """A connection in a transaction holding the write lock until it ends."""
        async with await self._acquire() as connection, connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", _WRITE_LOCK)
            yield connection

    # --- reading ---

    async def keys_since(self, revision: int) -> list[StoredKey]:
        """Every key changed after `revision` (deleted ones too), in the order of their changes."""
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE revision > $1 ORDER BY revision", revision
            )
        return [_key(row) for row in rows]

    async def keys(self, tenant: str | None = None) -> list[StoredKey]:
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE deleted_at IS NULL "
                "AND ($1::text IS NULL OR tenant = $1) ORDER BY name",
                tenant,
            )
        return [_key(row) for row in rows]

    async def key(self, name: str) -> StoredKey:
        async with await self._acquire() as connection:
            row = await connection.fetchrow(
                f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE name = $1 AND deleted_at IS NULL", name
            )
        if row is None:
            raise NotFound(f"no stored key named '{name}'")
        return _key(row)

    async def tenants(self) -> list[Tenant]:
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE deleted_at IS NULL ORDER BY name"
            )
        return [_tenant(row) for row in rows]

    async def tenant(self, name: str, connection: Any = None) -> Tenant:
        if connection is None:
            async with await self._acquire() as connection:
                return await self.tenant(name, connection)
        row = await connection.fetchrow(
            f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE name = $1 AND deleted_at IS NULL", name
        )
        if row is None:
            raise NotFound(f"no tenant named '{name}'")
        return _tenant(row)

    async def admin_token(self, digest: bytes) -> tuple[str, str, str | None] | None:
        """The admin token with this digest, unexpired and not deleted: (name, role, tenant)."""
        async with await self._acquire() as connection:
            row = await connection.fetchrow(
                "SELECT name, role, tenant FROM admin_tokens WHERE sha256 = $1 AND deleted_at IS NULL "
                "AND (expires_at IS NULL OR expires_at > now())",
                digest,
            )
        return (row["name"], row["role"], row["tenant"]) if row is not None else None

    async def console_secret(self) -> bytes:
        """The console's session key: made (256 random bits) by the first instance to ask."""
        async with await self._acquire() as connection:
            await connection.execute(
                "INSERT INTO console_secret (secret) VALUES ($1) ON CONFLICT DO NOTHING", secrets.token_bytes(32)
            )
            return await connection.fetchval("SELECT secret FROM console_secret")

    async def admin_tokens(self) -> list[dict[str, Any]]:
        """Every admin token not deleted: its name, role, tenant, expiry and maker (never its secret)."""
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                "SELECT name, role, tenant, expires_at, created_at, created_by FROM "
                "admin_tokens WHERE deleted_at IS NULL ORDER BY name"
            )
        return [
            {
                **dict(row),
                "expires_at": row["expires_at"].isoformat() if row["expires_at"] else None,
                "created_at": row["created_at"].isoformat(),
            }
            for row in rows
        ]

    async def audit(
        self,
        *,
        tenant: str | None = None,
        target: str | None = None,
        actor: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                "SELECT id, at, actor, role, tenant_scope, action, outcome, target_kind, target, tenant, before, "
                "after, source_ip, request_id FROM audit_log WHERE ($1::text IS NULL OR tenant = $1) "
                "AND ($2::text IS NULL OR target = $2) AND ($3::text IS NULL OR actor = $3) "
                "AND ($4::bigint IS NULL OR id < $4) ORDER BY id DESC LIMIT $5",
                tenant,
                target,
                actor,
                before_id,
                limit,
            )
        return [
            {
                **dict(row),
                "at": row["at"].isoformat(),
                "before": json.loads(row["before"]) if row["before"] else None,
                "after": json.loads(row["after"]) if row["after"] else None,
            }
            for row in rows
        ]

    # --- changing ---

    async def revisions(self) -> tuple[int, dict[str, int]]:
        """Every key stored now by name, with the revision of its last change, and the revision
        all of it is as of: what a full re-read compares with what a process holds."""
        async with await self._acquire() as connection, connection.transaction(isolation="repeatable_read"):
            revision = await connection.fetchval("SELECT coalesce(max(revision), 0) FROM stored_keys")
            rows = await connection.fetch("SELECT name, revision FROM stored_keys WHERE deleted_at IS NULL")
        return revision, {row["name"]: row["revision"] for row in rows}

    async def keys_named(self, names: list[str]) -> list[StoredKey]:
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE name = any($1::text[]) "
                "AND deleted_at IS NULL ORDER BY revision",
                names,
            )
        return [_key(row) for row in rows]

    async def record(
        self,
        actor: Actor,
        action: str,
        outcome: str,
        *,
        kind: str | None = None,
        target: str | None = None,
        tenant: str | None = None,
    ) -> None:
        """An attempt that changed nothing (refused), in the audit trail all the same."""
        async with await self._acquire() as connection:
            await _audit(connection, actor, action, outcome, kind, target, tenant, None, None)

    async def create_key(
        self, actor: Actor, name: str, tenant: str | None, spec: dict[str, Any], idempotency_key: str | None = None
    ) -> tuple[StoredKey, str | None]:
        """The new key and its secret (shown this once). With an `idempotency_key` already used,
        the key it created then, and no secret (it is kept nowhere)."""
        secret, digest = new_secret()
        async with self._change() as connection:
            if idempotency_key is not None:
                # Scoped to who asks: another caller's id is no id of this one's.
                idempotency_key = f"{actor.name}\x1f{idempotency_key}"
                row = await connection.fetchrow(
                    f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE idempotency_key = $1", idempotency_key
                )
                if row is not None:
                    earlier = _key(row)
                    if earlier.name != name or earlier.tenant != tenant or earlier.deleted_at is not None:
                        raise Conflict("this Idempotency-Key was used for another create (or its key is deleted)")
                    return earlier, None
            await self._tenant_exists(connection, tenant)
            if await connection.fetchval("SELECT 1 FROM stored_keys WHERE name = $1 AND deleted_at IS NULL", name):
                raise Conflict(f"a stored key named '{name}' exists")
            row = await connection.fetchrow(
                "INSERT INTO stored_keys (name, sha256, tenant, spec, idempotency_key, revision, created_by, "
                "updated_by) VALUES ($1, $2, $3, $4, $5, nextval('key_store_revision'), $6, $6) "
                f"RETURNING {_KEY_COLUMNS}",
                name,
                digest,
                tenant,
                json.dumps(spec),
                idempotency_key,
                actor.name,
            )
            key = _key(row)
            await _audit(connection, actor, "key.create", "ok", "key", name, tenant, None, _shown(key))
            await _notify(connection, key.revision)
        return key, secret

    async def update_key(self, actor: Actor, name: str, action: str, spec: dict[str, Any]) -> StoredKey:
        async with self._change() as connection:
            before = await self._locked_key(connection, name)
            row = await connection.fetchrow(
                f"UPDATE stored_keys SET spec = $2, revision = nextval('key_store_revision'), updated_at = now(), "
                f"updated_by = $3 WHERE name = $1 AND deleted_at IS NULL RETURNING {_KEY_COLUMNS}",
                name,
                json.dumps(spec),
                actor.name,
            )
            key = _key(row)
            await _audit(connection, actor, action, "ok", "key", name, key.tenant, _shown(before), _shown(key))
            await _notify(connection, key.revision)
        return key

    async def rotate_key(self, actor: Actor, name: str, grace_s: float) -> tuple[StoredKey, str]:
        """A new secret; the one it replaces keeps working `grace_s` more (0: not at all)."""
        secret, digest = new_secret()
        until = datetime.now(timezone.utc) + timedelta(seconds=grace_s) if grace_s > 0 else None
        async with self._change() as connection:
            before = await self._locked_key(connection, name)
            row = await connection.fetchrow(
                f"UPDATE stored_keys SET previous_sha256 = CASE WHEN $3::timestamptz IS NULL THEN NULL ELSE sha256 END,"
                f" previous_until = $3, sha256 = $2, revision = nextval('key_store_revision'), updated_at = now(), "
                f"updated_by = $4 WHERE name = $1 AND deleted_at IS NULL RETURNING {_KEY_COLUMNS}",
                name,
                digest,
                until,
                actor.name,
            )
            key = _key(row)
            await _audit(
                connection,
                actor,
                "key.rotate",
                "ok",
                "key",
                name,
                key.tenant,
                _shown(before),
                {**_shown(key), "previous_valid_until": until.isoformat() if until else None},
            )
            await _notify(connection, key.revision)
        return key, secret

    async def delete_key(self, actor: Actor, name: str) -> StoredKey:
        async with self._change() as connection:
            before = await self._locked_key(connection, name)
            row = await connection.fetchrow(
                f"UPDATE stored_keys SET deleted_at = now(), previous_sha256 = NULL, previous_until = NULL, "
                f"revision = nextval('key_store_revision'), updated_at = now(), updated_by = $2 "
                f"WHERE name = $1 AND deleted_at IS NULL RETURNING {_KEY_COLUMNS}",
                name,
                actor.name,
            )
            key = _key(row)
            await _audit(connection, actor, "key.delete", "ok", "key", name, key.tenant, _shown(before), None)
            await _notify(connection, key.revision)
        return key

    async def tenant_specs(self) -> dict[str, Tenant]:
        """Every tenant with settings of its own (limits, a budget), by name: what requests meet."""
        async with await self._acquire() as connection:
            rows = await connection.fetch(
                f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE deleted_at IS NULL AND spec <> '{{}}'::jsonb"
            )
        return {row["name"]: _tenant(row) for row in rows}

    async def create_tenant(
        self, actor: Actor, name: str, labels: dict[str, str], spec: dict[str, Any] | None = None
    ) -> Tenant:
        async with self._change() as connection:
            if await connection.fetchval("SELECT 1 FROM tenants WHERE name = $1 AND deleted_at IS NULL", name):
                raise Conflict(f"a tenant named '{name}' exists")
            revision = await connection.fetchval("SELECT nextval('key_store_revision')")
            row = await connection.fetchrow(
                f"INSERT INTO tenants (name, labels, spec, revision, created_by, updated_by) "
                f"VALUES ($1, $2, $3, $4, $5, $5) RETURNING {_TENANT_COLUMNS}",
                name,
                json.dumps(labels),
                json.dumps(spec or {}),
                revision,
                actor.name,
            )
            tenant = _tenant(row)
            await _audit(connection, actor, "tenant.create", "ok", "tenant", name, name, None, tenant.view())
            await _notify(connection, revision)
        return tenant

    async def update_tenant(
        self, actor: Actor, name: str, labels: dict[str, str], spec: dict[str, Any] | None = None
    ) -> Tenant:
        """New labels, and (given) new settings in place of the old."""
        async with self._change() as connection:
            before = await self.tenant(name, connection)
            row = await connection.fetchrow(
                f"UPDATE tenants SET labels = $2, spec = $3, revision = nextval('key_store_revision'), "
                f"updated_at = now(), updated_by = $4 WHERE name = $1 AND deleted_at IS NULL "
                f"RETURNING {_TENANT_COLUMNS}, revision",
                name,
                json.dumps(labels),
                json.dumps(spec if spec is not None else before.spec),
                actor.name,
            )
            tenant = _tenant(row)
            await _audit(connection, actor, "tenant.update", "ok", "tenant", name, name, before.view(), tenant.view())
            await _notify(connection, row["revision"])
        return tenant

    async def delete_tenant(self, actor: Actor, name: str) -> None:
        """Only a tenant no stored key belongs to: its keys are deleted (or moved) first."""
        async with self._change() as connection:
            before = await self.tenant(name, connection)
            keys = await connection.fetchval(
                "SELECT count(*) FROM stored_keys WHERE tenant = $1 AND deleted_at IS NULL", name
            )
            if keys:
                raise Conflict(f"tenant '{name}' still has {keys} key(s): delete them first")
            revision = await connection.fetchval(
                "UPDATE tenants SET deleted_at = now(), revision = nextval('key_store_revision'), updated_by = $2 "
                "WHERE name = $1 AND deleted_at IS NULL RETURNING revision",
                name,
                actor.name,
            )
            # Its admins go with it: a token naming a tenant of the same name made later is no token of that one.
            tokens = await connection.fetch(
                "UPDATE admin_tokens SET deleted_at = now() WHERE tenant = $1 AND deleted_at IS NULL RETURNING name",
                name,
            )
            await _audit(
                connection,
                actor,
                "tenant.delete",
                "ok",
                "tenant",
                name,
                name,
                before.view(),
                {"admin_tokens_deleted": sorted(row["name"] for row in tokens)} if tokens else None,
            )
            await _notify(connection, revision)

    async def create_admin_token(
        self, actor: Actor, name: str, role: str, tenant: str | None, expires_at: datetime | None
    ) -> str:
        secret, digest = new_secret()
        async with self._change() as connection:
            await self._tenant_exists(connection, tenant)
            if await connection.fetchval("SELECT 1 FROM admin_tokens WHERE name = $1 AND deleted_at IS NULL", name):
                raise Conflict(f"an admin token named '{name}' exists")
            await connection.execute(
                "INSERT INTO admin_tokens (name, sha256, role, tenant, expires_at, created_by) "
                "VALUES ($1, $2, $3, $4, $5, $6)",
                name,
                digest,
                role,
                tenant,
                expires_at,
                actor.name,
            )
            await _audit(
                connection,
                actor,
                "admin_token.create",
                "ok",
                "admin_token",
                name,
                tenant,
                None,
                {
                    "name": name,
                    "role": role,
                    "tenant": tenant,
                    "expires_at": expires_at.isoformat() if expires_at else None,
                },
            )
        return secret

    async def delete_admin_token(self, actor: Actor, name: str) -> None:
        async with self._change() as connection:
            done = await connection.fetchval(
                "UPDATE admin_tokens SET deleted_at = now() WHERE name = $1 AND deleted_at IS NULL RETURNING role", name
            )
            if done is None:
                raise NotFound(f"no admin token named '{name}'")
            await _audit(connection, actor, "admin_token.delete", "ok", "admin_token", name, None, {"name": name}, None)

    async def _locked_key(self, connection: Any, name: str) -> StoredKey:
        row = await connection.fetchrow(
            f"SELECT {_KEY_COLUMNS} FROM stored_keys WHERE name = $1 AND deleted_at IS NULL FOR UPDATE", name
        )
        if row is None:
            raise NotFound(f"no stored key named '{name}'")
        return _key(row)

    @staticmethod
    async def _tenant_exists(connection: Any, tenant: str | None) -> None:
        if tenant is not None and not await connection.fetchval(
            "SELECT 1 FROM tenants WHERE name = $1 AND deleted_at IS NULL", tenant
        ):
            raise Conflict(f"no tenant named '{tenant}': create it first")


def _shown(key: StoredKey) -> dict[str, Any]:
    """A key as the audit trail keeps it: its settings and its secret's fingerprint, not the secret."""
    return {"name": key.name, "tenant": key.tenant, **key.spec, "fingerprint": key.sha256.hex()[:8]}


async def _audit(
    connection: Any,
    actor: Actor,
    action: str,
    outcome: str,
    kind: str | None,
    target: str | None,
    tenant: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    await connection.execute(
        "INSERT INTO audit_log (actor, role, tenant_scope, action, outcome, target_kind, target, tenant, before, "
        "after, source_ip, request_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        actor.name,
        actor.role,
        actor.tenant,
        action,
        outcome,
        kind,
        target,
        tenant,
        json.dumps(before, default=str) if before is not None else None,
        json.dumps(after, default=str) if after is not None else None,
        actor.source_ip,
        actor.request_id,
    )


async def _notify(connection: Any, revision: int) -> None:
    await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, str(revision))
