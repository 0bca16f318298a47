"""Schemas in PostgreSQL that the gateway creates and migrates itself (the usage ledger's, the
key store's).

Each migration runs once, in order, inside one transaction with the version it brings, under an
advisory lock of the schema's own, so instances starting together migrate once. A database whose
version is newer than this release knows is left alone (`SchemaTooNew`): an older instance during
a rolling upgrade never writes into a shape it does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


def postgres_url(value: str | None) -> str | None:
    """`value` when it is a PostgreSQL URL (or None); ValueError, saying what one looks like, when not."""
    if value is None:
        return value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (read for its check: a port that is no number raises)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError("a PostgreSQL URL: postgresql://user:password@host:5432/database")
    return value


class SchemaTooNew(Exception):
    """The database was migrated by a newer release."""


@dataclass(slots=True, frozen=True)
class Schema:
    what: str  # named in errors: "the ledger's schema"
    version_table: str  # where the versions applied are kept
    lock: int  # the advisory lock the migrations take
    migrations: Sequence[str]

    async def migrate(self, connection: Any) -> int:
        """Bring the schema up to date; the version it is at after."""
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", self.lock)
            await connection.execute(
                f"CREATE TABLE IF NOT EXISTS {self.version_table} "
                "(version integer NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())"
            )
            version = await connection.fetchval(f"SELECT coalesce(max(version), 0) FROM {self.version_table}")
            if version > len(self.migrations):
                raise SchemaTooNew(f"{self.what} is at version {version}; this release knows {len(self.migrations)}")
            for number in range(version + 1, len(self.migrations) + 1):
                await connection.execute(self.migrations[number - 1])
                await connection.execute(f"INSERT INTO {self.version_table} (version) VALUES ($1)", number)
            return len(self.migrations)
