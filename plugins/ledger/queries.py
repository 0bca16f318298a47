"""The ledger's answers to the admin API's reads (`Plugin.query`): the requests recorded, newest
first, one request's whole record, and spend summed over a span.

Every filter is a fixed SQL fragment with the caller's value as a parameter, never its text in
the statement; each search the console offers has an index (schema.py, migration 3), so a page
of the newest matches reads that page, not the table. A query takes at most QUERY_TIMEOUT_S.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from plugins.ledger.report import GROUPS, moment
from plugins.ledger.schema import DAILY_SUMS
from proxy.core.plugin import QueryProblem

QUERY_TIMEOUT_S = 10.0
MOST_ROWS = 200  # a page of requests
MOST_GROUPS = 10_000  # rows of a spend summary
_DEFAULT_SPAN = "7d"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECONDS = re.compile(r"[0-9]{1,17}")  # ASCII digits, within what a datetime holds (to year 5000)
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
_STATUS = re.compile(r"([1-5])(?:xx|\d\d)")
# The columns of a page of requests (the whole record is one request's read).
_LISTED = (
    "request_id",
    "at",
    "key_name",
    "tenant",
    "route",
    "model",
    "channel",
    "status",
    "input_tokens",
    "output_tokens",
    "cost",
    "duration_ms",
    "error_code",
    "pending",
    "estimated",
    "client_aborted",
)
# Filters by equality: the parameter, and its column.
_EQUAL = {"key": "key_name", "tenant": "tenant", "model": "model", "route": "route", "channel": "channel"}
# A day row's columns as a row's, and a row's as a day row's sums (report.py's SUMS, in order).
_DAY_COLUMNS = (
    "NULLIF(tenant, '') AS tenant, NULLIF(key_name, '') AS key_name, NULLIF(model, '') AS model, route, "
    "NULLIF(channel, '') AS channel, status, " + ", ".join(DAILY_SUMS)
)
_ROW_COLUMNS = (
    "tenant, key_name, model, route, channel, status, 1, coalesce(input_tokens, 0), "
    "coalesce(cached_input_tokens, 0), coalesce(output_tokens, 0), coalesce(reasoning_tokens, 0), images, "
    "video_seconds, cost, CASE WHEN pending THEN cost ELSE 0 END, (NOT priced AND model IS NOT NULL)::int, "
    "estimated::int, client_aborted::int, (cut_by IS NOT NULL)::int, pending::int"
)
_SUMMED = ", ".join(
    f"sum({c}){'' if c in ('video_seconds', 'cost', 'pending_cost') else '::bigint'}" for c in DAILY_SUMS
)


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
            return (
                {"request": None}
                if name == "request"
                else {"requests": [], "next": None}
                if name == "requests"
                else {"rows": [], "by": [], "since": None, "until": None}
            )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        import asyncpg

        try:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self.database_url,
                    min_size=0,
                    max_size=2,
                    timeout=5,
                    command_timeout=QUERY_TIMEOUT_S,
                    server_settings={"timezone": "UTC"},
                )  # days are UTC days
            return await self._pool.fetch(sql, *args, timeout=QUERY_TIMEOUT_S)
        except asyncpg.UndefinedTableError:
            raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise OSError(f"the ledger's database refused a read ({type(exc).__name__})") from None

    async def _requests(self, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        where, args = _filters(tenant, params)
        limit = _whole(params.get("limit", "50"), "limit", 1, MOST_ROWS)
        if "request_id" in params:
            args.append(_text(params["request_id"], "request_id"))
            where.append(f"(request_id = ${len(args)} OR client_request_id = ${len(args)})")
        if "before" in params:  # the last row of the page before: its time (microseconds) and id
            at, _, request_id = params["before"].partition("_")
            if not _MICROSECONDS.fullmatch(at) or not _TEXT.fullmatch(request_id or "\x00"):
                raise QueryProblem("before", "the `next` of the page before")
            args += [_EPOCH + timedelta(microseconds=int(at)), request_id]
            where.append(f"(at, request_id) < (${len(args) - 1}, ${len(args)})")
        sql = (
            f"SELECT {', '.join(_LISTED)} FROM usage_records WHERE {' AND '.join(where) or 'true'} "
            f"ORDER BY at DESC, request_id DESC LIMIT {limit}"
        )
        found = await self._fetch(sql, *args)
        last = found[-1] if len(found) == limit else None
        # A cursor that needs no escaping in a URL: the time in microseconds, and the gateway's id.
        after = f"{(last['at'] - _EPOCH) // timedelta(microseconds=1)}_{last['request_id']}" if last else None
        return {"requests": [_plain_row(row) for row in found], "next": after}

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
        now = datetime.now(timezone.utc)
        since = _moment(params.get("since", _DEFAULT_SPAN), "since", now)
        until = _moment(params["until"], "until", now) if "until" in params else now
        if since >= until:
            raise QueryProblem("since", "before `until`")
        found = await self._summed(tenant, params, by, since, until)
        return {
            "by": by,
            "since": since.isoformat(),
            "until": until.isoformat(),
            "rows": found[:MOST_GROUPS],
            "cut": len(found) > MOST_GROUPS,
        }

    async def totals(self, column: str, value: str, since: datetime) -> dict[str, Any]:
        """What one key (`column` key) or tenant (`column` tenant: `tenant:NAME`) spent since then."""
        import asyncpg

        try:
            found = await self._summed(None, {column: value}, [], since, datetime.now(timezone.utc))
        except asyncpg.UndefinedTableError:  # no record was ever written
            found = []
        return found[0] if found else dict.fromkeys(DAILY_SUMS, 0)

    async def _summed(
        self, tenant: str | None, params: Mapping[str, str], by: list[str], since: datetime, until: datetime
    ) -> list[dict[str, Any]]:
        """Sums `by` the groups named (none: one row). Whole days (UTC) come from the day rows
        (schema.py, migration 4); the hours before the first and after the last of them from the
        rows themselves, through their time index."""
        first, last = _midnight(since, up=True), _midnight(until, up=False)
        if last < first:
            first = last = since  # no whole day: every row comes from the rows themselves
        args: list[Any] = [since, until, first, last]
        where = "".join(f" AND {term}" for term in _dimension_filters(tenant, params, args))
        grouped = ", ".join(GROUPS[part] for part in by)
        sql = (
            f"SELECT {grouped + ', ' if by else ''}{_SUMMED} FROM ("
            f"SELECT (day::timestamp AT TIME ZONE 'UTC') AS at, {_DAY_COLUMNS} FROM usage_daily "
            f"WHERE day >= ($3 AT TIME ZONE 'UTC')::date AND day < ($4 AT TIME ZONE 'UTC')::date{where} "
            f"UNION ALL SELECT at, {_ROW_COLUMNS} FROM usage_records "
            f"WHERE ((at >= $1 AND at < $3) OR (at >= $4 AND at < $2)){where}) AS spent"
            + (f" GROUP BY {grouped} ORDER BY {grouped} LIMIT {MOST_GROUPS + 1}" if by else "")
        )
        rows = []
        for record in await self._fetch(sql, *args):
            values = list(record.values())
            if not by and values[0] is None:
                continue  # nothing at all in the span
            row = {part: _plain(value) for part, value in zip(by, values)}
            row.update({name: _plain(value) or 0 for name, value in zip(DAILY_SUMS, values[len(by) :])})
            rows.append(row)
        return rows


def _filters(tenant: str | None, params: Mapping[str, str]) -> tuple[list[str], list[Any]]:
    """A search's WHERE terms and their arguments: its span (`since`, `until`) and its dimensions."""
    where: list[str] = []
    args: list[Any] = []
    now = datetime.now(timezone.utc)
    if "since" in params:
        args.append(_moment(params["since"], "since", now))
        where.append(f"at >= ${len(args)}")
    if "until" in params:
        args.append(_moment(params["until"], "until", now))
        where.append(f"at < ${len(args)}")
    return where + _dimension_filters(tenant, params, args), args


def _dimension_filters(tenant: str | None, params: Mapping[str, str], args: list[Any]) -> list[str]:
    """The terms on a row's key, tenant, model, route, channel and status (columns a day row has
    too), their values appended to `args`."""
    where: list[str] = []
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
    return where


def _midnight(moment: datetime, up: bool) -> datetime:
    """The midnight (UTC) at or after `moment` (`up`), or at or before it."""
    day = moment.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(days=1) if up and day < moment else day


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
