"""`modelgate usage report`: what the ledger holds, summed by key, tenant, model, route, channel or day.

modelgate usage report -c gateway.yaml --since 7d --by key,model --format csv
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import sys
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from plugins.ledger.schema import DAILY_SUMS
from proxy.config import GatewayConfig
from proxy.observability.safe_text import csv_cell, shown

# What --by may name, and the column (or expression) each groups by: never the user's text.
GROUPS = {
    "key": "key_name",
    "tenant": "tenant",
    "model": "model",
    "route": "route",
    "channel": "channel",
    "status": "status",
    "day": "date_trunc('day', at)",
}
SUMS = DAILY_SUMS  # the sums a report gives are the ones the day rows keep
_COUNTED = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens", "images")
AGGREGATES = ", ".join(
    [
        "count(*)",
        *(f"coalesce(sum({c}), 0)::bigint" for c in _COUNTED),
        "sum(video_seconds)",
        "sum(cost)",
        "coalesce(sum(cost) FILTER (WHERE pending), 0)",
        "count(*) FILTER (WHERE NOT priced AND model IS NOT NULL)",
        "count(*) FILTER (WHERE estimated)",
        "count(*) FILTER (WHERE client_aborted)",
        "count(*) FILTER (WHERE cut_by IS NOT NULL)",
        "count(*) FILTER (WHERE pending)",
    ]
)
_SPAN = re.compile(r"^(\d{1,6})([mhdw])$")
_CONFIG_HELP = "config file (default: $MODELGATE_CONFIG, else the embedded defaults)"


def arguments(usage: argparse.ArgumentParser) -> None:
    usage.add_argument("-c", "--config", help=_CONFIG_HELP)
    actions = usage.add_subparsers(dest="action", required=True)
    report = actions.add_parser("report", help="sum the ledger's records over a time span, grouped")
    report.add_argument(
        "--since", default="1d", help="a span back from now (30m, 12h, 7d, 4w) or an ISO date/time (default: 1d)"
    )
    report.add_argument("--until", help="an ISO date/time (default: now)")
    report.add_argument("--by", default="key", help=f"comma-separated, of: {', '.join(GROUPS)} (default: key)")
    report.add_argument("--format", choices=("table", "csv", "json"), default="table")
    report.add_argument("-c", "--config", help=_CONFIG_HELP, default=argparse.SUPPRESS)


def run_command(config: GatewayConfig, args: argparse.Namespace) -> int:
    from plugins.ledger.settings import LedgerSettings

    settings = LedgerSettings.model_validate(config.plugins.get("ledger", {}))
    if settings.database_url is None:
        print("the ledger has no database in this config (plugins.ledger.database_url)", file=sys.stderr)
        return 1
    try:
        by = [part.strip() for part in args.by.split(",") if part.strip()]
        unknown = [part for part in by if part not in GROUPS]
        if unknown or not by:
            raise ValueError(f"--by takes {', '.join(GROUPS)} (comma-separated), not {', '.join(unknown) or 'nothing'}")
        now = datetime.now(timezone.utc)
        since, until = moment(args.since, now), moment(args.until, now) if args.until else now
        if since >= until:
            raise ValueError(f"--since ({since.isoformat()}) is not before --until ({until.isoformat()})")
    except ValueError as exc:
        print(f"modelgate usage report: {exc}", file=sys.stderr)
        return 2
    try:
        rows = asyncio.run(_query(settings.database_url, by, since, until))
    except Exception as exc:  # noqa: BLE001 (PostgreSQL away or refusing: said in a line, not a traceback)
        print(f"modelgate usage report: the ledger's database did not answer ({type(exc).__name__})", file=sys.stderr)
        return 1
    write(rows, by, args.format, sys.stdout)
    print(f"{len(rows)} group(s), {since.isoformat()} to {until.isoformat()}", file=sys.stderr)
    return 0


def moment(text: str, now: datetime) -> datetime:
    """A span back from `now` (7d) or an ISO date or date/time (UTC unless it says otherwise)."""
    span = _SPAN.match(text.strip())
    unit = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[span[2]] if span else ""
    try:
        found = now - timedelta(**{unit: int(span[1])}) if span else datetime.fromisoformat(text.strip())
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is neither a span (30m, 12h, 7d, 4w) back from now nor an ISO date/time") from None
    return found if found.tzinfo is not None else found.replace(tzinfo=timezone.utc)


async def _query(database_url: str, by: list[str], since: datetime, until: datetime) -> list[dict[str, Any]]:
    import asyncpg

    columns = [GROUPS[name] for name in by]
    grouped = ", ".join(columns)
    sql = (
        f"SELECT {grouped}, {AGGREGATES} FROM usage_records WHERE at >= $1 AND at < $2 "
        f"GROUP BY {grouped} ORDER BY sum(cost) DESC, count(*) DESC"
    )
    connection = await asyncpg.connect(database_url)
    try:
        found = await connection.fetch(sql, since, until)
    except asyncpg.UndefinedTableError:
        found = []  # no record was ever written
    finally:
        await connection.close()
    return [dict(zip([*by, *SUMS], [_plain(v) for v in record.values()])) for record in found]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.date().isoformat()
    return value


def write(rows: list[dict[str, Any]], by: list[str], form: str, out: Any) -> None:
    names = [*by, *SUMS]
    if form == "json":
        json.dump(rows, out, indent=1)
        out.write("\n")
    elif form == "csv":
        writer = csv.DictWriter(out, names, lineterminator="\n")
        writer.writeheader()
        # A model name a client chose reaches a spreadsheet: nothing in it may run or hide there.
        writer.writerows({name: csv_cell(value) for name, value in row.items()} for row in rows)
    else:
        cells = [names] + [[_cell(row[n]) for n in names] for row in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
        for line in cells:
            cells = (c.rjust(w) if i >= len(by) else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
            out.write("  ".join(cells).rstrip() + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    return shown(str(value))  # a model name a client chose goes to a terminal: nothing in it may steer one
