"""The ledger's answers to the admin API's reads (`Plugin.query`): the requests recorded, newest
first, one request's whole record, and spend summed over a span.

Every filter is a fixed SQL fragment with the caller's value as a parameter, never its text in
the statement; each search the console offers has an index (schema.py, migration 3), so a page
of the newest matches reads that page, not the table. A query takes at most QUERY_TIMEOUT_S.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from plugins.ledger.report import AGGREGATES, GROUPS, SUMS, moment
from proxy.plugin import QueryProblem

QUERY_TIMEOUT_S = 10.0
MOST_ROWS = 200        # a page of requests
MOST_GROUPS = 10_000   # rows of a spend summary
_DEFAULT_SPAN = "7d"
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
_STATUS = re.compile(r"([1-5])(?:xx|\d\d)")
# The columns of a page of requests (the whole record is one request's read).
_LISTED = ("request_id", "at", "key_name", "tenant", "route", "model", "channel", "status", "input_tokens",
           "output_tokens", "cost", "duration_ms", "error_code", "pending", "estimated", "client_aborted")
# Filters by equality: the parameter, and its column.
_EQUAL = {"key": "key_name", "tenant": "tenant", "model": "model", "route": "route", "channel": "channel"}


class LedgerQueries:
    """A small pool of its own on the ledger's database, opened when first asked (the writer's
    connections are for writing: a slow search must never hold a batch back)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._pool: Any = None

    async def run(self, name: str, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        import asyncpg

        try:
            if name == "requests":
                return await self._requests(tenant, params)
            if name == "request":
                return await self._request(tenant, params.get("id", ""))
            return await self._spend(tenant, params)
        except asyncpg.UndefinedTableError:  # no record was ever written
            return {"request": None} if name == "request" else {"requests": [], "next": None} \
                if name == "requests" else {"rows": [], "by": [], "since": None, "until": None}
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise OSError(f"the ledger's database refused a read ({type(exc).__name__})") from None

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        import asyncpg

        if self._pool is None:
            self._pool = await asyncpg.create_pool(self.database_url, min_size=0, max_size=2, timeout=5,
                                                   command_timeout=QUERY_TIMEOUT_S)
        return await self._pool.fetch(sql, *args, timeout=QUERY_TIMEOUT_S)

    async def _requests(self, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        where, args = _filters(tenant, params)
        limit = _whole(params.get("limit", "50"), "limit", 1, MOST_ROWS)
        if "request_id" in params:
            args.append(_text(params["request_id"], "request_id"))
            where.append(f"(request_id = ${len(args)} OR client_request_id = ${len(args)})")
        if "before" in params:  # the last row of the page before: its time and id
            at, _, request_id = params["before"].partition("|")
            args += [_moment(at, "before"), request_id]
            where.append(f"(at, request_id) < (${len(args) - 1}, ${len(args)})")
        sql = (f"SELECT {', '.join(_LISTED)} FROM usage_records WHERE {' AND '.join(where) or 'true'} "
               f"ORDER BY at DESC, request_id DESC LIMIT {limit}")
        rows = [_plain_row(row) for row in await self._fetch(sql, *args)]
        last = rows[-1] if len(rows) == limit else None
        return {"requests": rows, "next": f"{last['at']}|{last['request_id']}" if last else None}

    async def _request(self, tenant: str | None, request_id: str) -> dict[str, Any]:
        args: list[Any] = [_text(request_id, "id")]
        sql = "SELECT * FROM usage_records WHERE request_id = $1"
        if tenant is not None:
            args.append(tenant)
            sql += " AND tenant = $2"
        rows = await self._fetch(sql, *args)
        return {"request": _plain_row(rows[0]) if rows else None}

    async def _spend(self, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        by = [part.strip() for part in params.get("by", "day").split(",") if part.strip()]
        if not by or len(by) > 3 or any(part not in GROUPS for part in by):
            raise QueryProblem("by", f"one to three of {', '.join(GROUPS)}, comma-separated")
        where, args = _filters(tenant, params, default_since=_DEFAULT_SPAN)
        columns = [GROUPS[part] for part in by]
        grouped = ", ".join(columns)
        sql = (f"SELECT {grouped}, {AGGREGATES} FROM usage_records WHERE {' AND '.join(where)} "
               f"GROUP BY {grouped} ORDER BY {grouped} LIMIT {MOST_GROUPS + 1}")
        found = await self._fetch(sql, *args)
        rows = []
        for record in found[:MOST_GROUPS]:
            values = list(record.values())
            row = {part: _plain(value) for part, value in zip(by, values)}
            row.update({name: _plain(value) or 0 for name, value in zip(SUMS, values[len(by):])})
            rows.append(row)
        since = args[0]
        until = args[1] if len(args) > 1 and isinstance(args[1], datetime) else datetime.now(timezone.utc)
        return {"by": by, "since": since.isoformat(), "until": until.isoformat(), "rows": rows,
                "cut": len(found) > MOST_GROUPS}


def _filters(tenant: str | None, params: Mapping[str, str],
             default_since: str | None = None) -> tuple[list[str], list[Any]]:
    """The WHERE terms and their arguments; a span first (`since`, then `until`, when given)."""
    where: list[str] = []
    args: list[Any] = []
    now = datetime.now(timezone.utc)
    since = params.get("since", default_since)
    if since is not None:
        args.append(_moment(since, "since", now))
        where.append(f"at >= ${len(args)}")
    if "until" in params:
        args.append(_moment(params["until"], "until", now))
        where.append(f"at < ${len(args)}")
    for name, column in _EQUAL.items():
        if name in params:
            args.append(_text(params[name], name))
            where.append(f"{column} = ${len(args)}")
    if tenant is not None:  # the caller's own tenant: on top of whatever it asked
        args.append(tenant)
        where.append(f"tenant = ${len(args)}")
    if "status" in params:
        status = _STATUS.fullmatch(params["status"].strip())
        if status is None:
            raise QueryProblem("status", "a status (404) or a class (5xx)")
        if params["status"].strip().endswith("xx"):
            args += [int(status[1]) * 100, int(status[1]) * 100 + 99]
            where.append(f"status BETWEEN ${len(args) - 1} AND ${len(args)}")
        else:
            args.append(int(params["status"]))
            where.append(f"status = ${len(args)}")
    return where, args


def _moment(text: str, field: str, now: datetime | None = None) -> datetime:
    try:
        return moment(text, now or datetime.now(timezone.utc))
    except (ValueError, OverflowError):
        raise QueryProblem(field, "a span back from now (30m, 12h, 7d) or an ISO date/time") from None


def _text(value: str, field: str) -> str:
    if not _TEXT.fullmatch(value):
        raise QueryProblem(field, "1-256 characters, no control characters")
    return value


def _whole(value: str, field: str, least: int, most: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if not least <= number <= most:
        raise QueryProblem(field, f"a whole number, {least} to {most}")
    return number


def _plain_row(record: Any) -> dict[str, Any]:
    return {name: _plain(value) for name, value in record.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
