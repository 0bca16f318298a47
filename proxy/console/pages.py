"""The console's pages, each over the admin API's operations as the signed-in admin (`Page.actor`):
what a role may not read or change is refused here as the API refuses it, and written to the
audit trail as the API writes it."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from aiohttp import web

from proxy.console.answers import FormProblem, Page, read_form, secure, see_other
from proxy.console.charts import bars
from proxy.console.session import PATH
from proxy.core import jsonutil
from proxy.keystore.operations import AdminError
from proxy.observability.safe_text import csv_cell

if TYPE_CHECKING:
    from proxy.console import Console

# What a key's page shows apart from its settings (and what an edit leaves alone).
_KEY_META = (
    "name",
    "source",
    "tenant",
    "state",
    "fingerprint",
    "previous_valid_until",
    "revision",
    "created_at",
    "created_by",
    "updated_at",
    "updated_by",
    "enabled",
)
_TENANT_META = ("name", "labels", "created_at", "created_by", "updated_at", "updated_by")
_REQUEST_FILTERS = ("key", "tenant", "model", "route", "status", "since", "until", "request_id")
_SPEND_GROUPS = ("tenant", "key", "model", "route", "channel")
_WHOLE = re.compile(r"[0-9]{1,12}")  # ASCII digits only (str.isdigit takes '²', which int() refuses)


async def keys(console: Console, page: Page) -> web.StreamResponse:
    query = page.request.query
    listed = await console.ops.list_keys(
        page.actor, query.get("tenant") or None, query.get("label") or None, query.get("state") or None
    )
    tenants = await _tenant_names(console, page)
    return _render(console, page, "keys.html", keys=listed["keys"], tenants=tenants, query=query)


async def create_key(console: Console, page: Page) -> web.StreamResponse:
    form = await read_form(page.request)
    body: dict[str, Any] = _json_object(form.get("settings", ""), "settings")
    body["name"] = form.get("name", "").strip()
    if form.get("tenant"):
        body["tenant"] = form["tenant"]
    if form.get("models", "").strip():
        body["models"] = [m.strip() for m in form["models"].split(",") if m.strip()]
    if form.get("expires_at", "").strip():
        body["expires_at"] = _moment(form["expires_at"])
    made = await console.ops.create_key(page.actor, body)
    return _render(
        console,
        page,
        "secret.html",
        key=made,
        secret=made["secret"],
        made="created",
        gateway_url=console.gateway_url(),
        model=console.example_model(made.get("models") or ["*"]),
    )


async def key(console: Console, page: Page) -> web.StreamResponse:
    name = page.request.match_info["name"]
    found = await console.ops.get_key(page.actor, name)
    settings = {k: v for k, v in found.items() if k not in _KEY_META}
    usage = await _usage(console.ops.key_usage(page.actor, name))
    return _render(
        console,
        page,
        "key.html",
        key=found,
        settings=jsonutil.dumps(settings).decode(),
        usage=usage,
        stored=found.get("source") == "store",
    )


async def update_key(console: Console, page: Page) -> web.StreamResponse:
    name = page.request.match_info["name"]
    form = await read_form(page.request)
    wanted = _json_object(form.get("settings", ""), "settings")
    changes = _changes(await console.ops.get_key(page.actor, name), wanted, _KEY_META)
    await console.ops.update_key(page.actor, name, changes)
    return see_other(f"{PATH}/keys/{quote(name)}")


async def key_action(console: Console, page: Page) -> web.StreamResponse:
    name, action = page.request.match_info["name"], page.request.match_info["action"]
    if action in ("disable", "enable"):
        await console.ops.set_enabled(page.actor, name, action == "enable")
    elif action == "rotate":
        form = await read_form(page.request)
        grace = form.get("grace_s", "0").strip() or "0"
        if not _WHOLE.fullmatch(grace):
            raise FormProblem("The old secret's grace is a number of seconds.")
        made = await console.ops.rotate_key(page.actor, name, {"grace_s": int(grace)})
        return _render(
            console,
            page,
            "secret.html",
            key=made,
            secret=made["secret"],
            made="rotated",
            gateway_url=console.gateway_url(),
            model=console.example_model(made.get("models") or ["*"]),
        )
    elif action == "delete":
        await console.ops.delete_key(page.actor, name)
        return see_other(f"{PATH}/keys")
    else:
        raise AdminError(404, "not_found", "no such action on a key")
    return see_other(f"{PATH}/keys/{quote(name)}")


async def tenants(console: Console, page: Page) -> web.StreamResponse:
    listed = await console.ops.list_tenants(page.actor)
    return _render(console, page, "tenants.html", tenants=listed["tenants"])


async def create_tenant(console: Console, page: Page) -> web.StreamResponse:
    form = await read_form(page.request)
    body = _json_object(form.get("settings", ""), "settings")
    body["name"] = form.get("name", "").strip()
    if form.get("labels", "").strip():
        body["labels"] = _json_object(form["labels"], "labels")
    made = await console.ops.create_tenant(page.actor, body)
    return see_other(f"{PATH}/tenants/{quote(made['name'])}")


async def tenant(console: Console, page: Page) -> web.StreamResponse:
    name = page.request.match_info["name"]
    found = await console.ops.get_tenant(page.actor, name)
    settings = {k: v for k, v in found.items() if k not in _TENANT_META}
    usage = await _usage(console.ops.tenant_usage(page.actor, name))
    tenant_keys = (await console.ops.list_keys(page.actor, name))["keys"]
    return _render(
        console,
        page,
        "tenant.html",
        tenant=found,
        settings=jsonutil.dumps(settings).decode(),
        labels=jsonutil.dumps(found.get("labels") or {}).decode(),
        usage=usage,
        keys=tenant_keys,
    )


async def update_tenant(console: Console, page: Page) -> web.StreamResponse:
    name = page.request.match_info["name"]
    form = await read_form(page.request)
    if form.get("delete") == "yes":
        await console.ops.delete_tenant(page.actor, name)
        return see_other(f"{PATH}/tenants")
    wanted = _json_object(form.get("settings", ""), "settings")
    changes = _changes(await console.ops.get_tenant(page.actor, name), wanted, _TENANT_META)
    if "labels" in form:
        changes["labels"] = _json_object(form["labels"], "labels")
    await console.ops.update_tenant(page.actor, name, changes)
    return see_other(f"{PATH}/tenants/{quote(name)}")


async def admin_tokens(console: Console, page: Page) -> web.StreamResponse:
    listed = await console.ops.list_admin_tokens(page.actor)
    return _render(
        console, page, "admin_tokens.html", tokens=listed["admin_tokens"], tenants=await _tenant_names(console, page)
    )


async def create_admin_token(console: Console, page: Page) -> web.StreamResponse:
    form = await read_form(page.request)
    body: dict[str, Any] = {"name": form.get("name", "").strip(), "role": form.get("role", "")}
    if form.get("role") == "tenant-admin":
        body["tenant"] = form.get("tenant") or None
    if form.get("expires_at", "").strip():
        body["expires_at"] = _moment(form["expires_at"])
    made = await console.ops.create_admin_token(page.actor, body)
    return _render(console, page, "admin_token_created.html", token=made, secret=made["secret"])


async def delete_admin_token(console: Console, page: Page) -> web.StreamResponse:
    await console.ops.delete_admin_token(page.actor, page.request.match_info["name"])
    return see_other(f"{PATH}/admin-tokens")


async def spend(console: Console, page: Page) -> web.StreamResponse:
    query = page.request.query
    group = query.get("by", "tenant") if query.get("by", "tenant") in _SPEND_GROUPS else "tenant"
    filters = {k: query[k] for k in ("since", "until", "tenant", "key", "model") if query.get(k)}
    filters.setdefault("since", "30d")
    if query.get("format") == "csv":
        grouped = await console.reads.spend(page.actor, {**filters, "by": group})
        return _csv(grouped["rows"], [group], f"spend-by-{group}.csv")
    # Both at once, on two of the database's connections: each reads the same span.
    grouped, daily = await asyncio.gather(
        console.reads.spend(page.actor, {**filters, "by": group}),
        console.reads.spend(page.actor, {**filters, "by": "day"}),
    )
    chart = bars(_every_day(daily))
    budgets = None
    if filters.get("key"):
        budgets = await _usage(console.ops.key_usage(page.actor, filters["key"]))
    elif filters.get("tenant") or page.actor.role == "tenant-admin":
        budgets = await _usage(console.ops.tenant_usage(page.actor, filters.get("tenant") or page.actor.tenant or ""))
    rows = sorted(grouped["rows"], key=lambda row: -row["cost"])
    return _render(
        console,
        page,
        "spend.html",
        rows=rows,
        group=group,
        groups=_SPEND_GROUPS,
        chart=chart,
        daily=daily["rows"],
        filters=filters,
        since=grouped["since"],
        until=grouped["until"],
        csv_link=f"{PATH}/spend?{urlencode({**filters, 'by': group, 'format': 'csv'})}",
        budgets=budgets,
    )


async def requests(console: Console, page: Page) -> web.StreamResponse:
    query = page.request.query
    filters = {k: query[k].strip() for k in _REQUEST_FILTERS if query.get(k, "").strip()}
    params = {**filters, **({"before": query["before"]} if query.get("before") else {})}
    found = await console.reads.requests(page.actor, params)
    after = f"{PATH}/requests?{urlencode({**filters, 'before': found['next']})}" if found["next"] else None
    return _render(console, page, "requests.html", requests=found["requests"], filters=filters, after=after)


async def request(console: Console, page: Page) -> web.StreamResponse:
    found = (await console.reads.request(page.actor, page.request.match_info["id"]))["request"]
    template = console.config().trace_url
    trace = template.replace("{trace_id}", found["trace_id"]) if template and found.get("trace_id") else None
    return _render(console, page, "request.html", record=found, trace=trace)


async def channels(console: Console, page: Page) -> web.StreamResponse:
    found = await console.reads.channels(page.actor)
    return _render(console, page, "channels.html", channels=found["channels"], at=found["at"])


async def audit(console: Console, page: Page) -> web.StreamResponse:
    query = page.request.query
    before = query.get("before", "")
    if before and not _WHOLE.fullmatch(before):
        raise FormProblem("'before' is an entry's number.")
    found = await console.ops.audit(
        page.actor,
        query.get("tenant") or None,
        query.get("target") or None,
        query.get("actor") or None,
        100,
        int(before) if before else None,
    )
    filters = {k: query[k] for k in ("tenant", "target", "actor") if query.get(k)}
    after = f"{PATH}/audit?{urlencode({**filters, 'before': found['next_before']})}" if found["next_before"] else None
    return _render(console, page, "audit.html", entries=found["entries"], filters=filters, after=after)


ROUTES = [
    ("GET", "/keys", keys),
    ("POST", "/keys", create_key),
    ("GET", "/keys/{name}", key),
    ("POST", "/keys/{name}", update_key),
    ("POST", "/keys/{name}/{action}", key_action),
    ("GET", "/tenants", tenants),
    ("POST", "/tenants", create_tenant),
    ("GET", "/tenants/{name}", tenant),
    ("POST", "/tenants/{name}", update_tenant),
    ("GET", "/admin-tokens", admin_tokens),
    ("POST", "/admin-tokens", create_admin_token),
    ("POST", "/admin-tokens/{name}/delete", delete_admin_token),
    ("GET", "/spend", spend),
    ("GET", "/requests", requests),
    ("GET", "/requests/{id}", request),
    ("GET", "/channels", channels),
    ("GET", "/audit", audit),
]


def _render(console: Console, page: Page, template: str, **context: Any) -> web.Response:
    return console.render(page.request, template, session=page.session, **context)


async def _tenant_names(console: Console, page: Page) -> list[str]:
    try:
        return [t["name"] for t in (await console.ops.list_tenants(page.actor))["tenants"]]
    except AdminError:
        return []


async def _usage(read: Any) -> dict[str, Any] | None:
    """A key's or tenant's usage as the plugins report it; None when none does (or may)."""
    try:
        return (await read).get("reports") or None
    except AdminError as exc:
        if exc.status in (400, 403, 404, 409):
            return None
        raise


def _changes(current: dict[str, Any], wanted: dict[str, Any], meta: tuple[str, ...]) -> dict[str, Any]:
    """What to PATCH: the form holds the whole of the settings, so a field taken out goes back to
    its default (null); what is not a setting (`meta`) is left alone."""
    changes: dict[str, Any] = {k: None for k in current if k not in meta and k not in wanted}
    changes.update({k: v for k, v in wanted.items() if k not in meta})
    return changes


def _json_object(text: str, field: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = jsonutil.loads(text)
    except ValueError:
        raise FormProblem(f"'{field}' is not JSON.") from None
    if not isinstance(value, dict):
        raise FormProblem(f"'{field}' is a JSON object: {{...}}.")
    return value


def _moment(text: str) -> str:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise FormProblem("The expiry is a date and time (2027-01-31T18:00).") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).isoformat()


def _every_day(daily: dict[str, Any]) -> list[tuple[str, float]]:
    """Cost on each day of the span, the days nothing was spent included (at most 366 bars)."""
    spent = {row["day"][:10]: row["cost"] for row in daily["rows"]}
    if not daily.get("since"):
        return sorted(spent.items())
    first = datetime.fromisoformat(daily["since"]).astimezone(timezone.utc).date()
    last = datetime.fromisoformat(daily["until"]).astimezone(timezone.utc).date()
    days = [(first + timedelta(days=n)).isoformat() for n in range(min(366, (last - first).days + 1))]
    return [(day, spent.get(day, 0.0)) for day in days[-366:]]


def _csv(rows: list[dict[str, Any]], by: list[str], filename: str) -> web.StreamResponse:
    out = io.StringIO()
    names = [*by, "requests", "input_tokens", "output_tokens", "cost", "pending_cost", "estimated"]
    writer = csv.DictWriter(out, names, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    # A model or key name a client chose reaches a spreadsheet: nothing in it may run or hide there.
    writer.writerows({name: csv_cell(row.get(name)) for name in names} for row in rows)
    return secure(
        web.Response(
            body=out.getvalue().encode(),
            content_type="text/csv",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )
    )
