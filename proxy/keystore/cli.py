"""`modelgate keys|tenants|admin-token|audit`: the admin API from a shell.

Each command talks to a running gateway's admin API (`--admin-url URL --admin-token TOKEN`, or
$MODELGATE_ADMIN_URL and $MODELGATE_ADMIN_TOKEN), or, with `-c CONFIG`, to the key store that
config names directly, as an owner (for bootstrap: the first admin token is made this way). The
answer is printed as JSON; a command that makes a secret (`keys create`, `keys rotate`,
`admin-token create`) prints the secret alone on the last line of standard output, so
`modelgate keys create ci | tail -1` is the key. Exit status: 0 done, 1 refused (the message on
standard error), 2 the store or the gateway did not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from proxy.keystore.roles import ROLES

COMMANDS = ("keys", "tenants", "admin-token", "audit")


def add_commands(commands: Any) -> None:
    """The four commands, on the `modelgate` parser's subparsers."""
    target = _target()
    keys = commands.add_parser("keys", help="gateway keys in the key store: create, list, rotate ...")
    actions = _Leaves(keys.add_subparsers(dest="action", required=True), target)
    create = actions.add_parser("create", help="a new key; its secret is the last line printed")
    create.add_argument("name")
    create.add_argument("--tenant")
    create.add_argument("--idempotency-key", help="a retry with the same value makes no second key")
    _key_settings(create)
    listing = actions.add_parser("list", help="every key, stored and configured")
    listing.add_argument("--tenant")
    listing.add_argument("--label", metavar="NAME=VALUE")
    listing.add_argument("--state", choices=("active", "disabled", "expired"))
    for action in ("show", "disable", "enable", "delete"):
        actions.add_parser(action).add_argument("name")
    actions.add_parser(
        "usage",
        help="its spend today and this month, its budgets' windows (a running gateway's plugins answer: --admin-url)",
    ).add_argument("name")
    update = actions.add_parser("update", help="change a key's settings (the ones given)")
    update.add_argument("name")
    _key_settings(update)
    rotate = actions.add_parser("rotate", help="a new secret; the old one works --grace-s more seconds")
    rotate.add_argument("name")
    rotate.add_argument("--grace-s", type=float, default=0.0)

    tenants = commands.add_parser("tenants", help="tenants in the key store")
    actions = _Leaves(tenants.add_subparsers(dest="action", required=True), target)
    for action in ("create", "update"):
        parser = actions.add_parser(
            action,
            help="limits (--rpm, --tpm, --concurrent) and --set budget=JSON hold for every key of the tenant together",
        )
        parser.add_argument("name")
        parser.add_argument("--label", action="append", default=[], metavar="NAME=VALUE")
        _limits_and_fields(parser)
    actions.add_parser("list")
    for action in ("show", "delete"):
        actions.add_parser(action).add_argument("name")
    actions.add_parser(
        "usage", help="the tenant's spend and budgets, every key of it together (--admin-url)"
    ).add_argument("name")

    tokens = commands.add_parser("admin-token", help="admin tokens: who may use the admin API")
    actions = _Leaves(tokens.add_subparsers(dest="action", required=True), target)
    create = actions.add_parser("create", help="a new admin token; its secret is the last line printed")
    create.add_argument("name")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--tenant", help="the one tenant a tenant-admin manages")
    create.add_argument("--expires", metavar="ISO8601")
    actions.add_parser("delete").add_argument("name")
    actions.add_parser("list", help="every admin token: name, role, tenant, expiry (never a secret)")

    audit = commands.add_parser("audit", help="the admin actions, newest first", parents=[target])
    audit.add_argument("--tenant")
    audit.add_argument("--target", help="a key's, tenant's or token's name")
    audit.add_argument("--actor")
    audit.add_argument("--limit", type=int, default=100)


class _Leaves:
    """A command's actions, each taking the options that say where to send it."""

    def __init__(self, actions: Any, target: argparse.ArgumentParser) -> None:
        self.actions, self.target = actions, target

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return self.actions.add_parser(name, parents=[self.target], **kwargs)


def _target() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-c", "--config", help="talk to the key store this config names, as an owner")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("MODELGATE_ADMIN_URL"),
        help="a gateway's admin listener (default $MODELGATE_ADMIN_URL)",
    )
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("MODELGATE_ADMIN_TOKEN"),
        help="an admin token (default $MODELGATE_ADMIN_TOKEN)",
    )
    return parser


def _key_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", metavar="GLOB")
    parser.add_argument("--endpoints", nargs="+", metavar="ROUTE")
    parser.add_argument("--label", action="append", default=[], metavar="NAME=VALUE")
    _limits_and_fields(parser)
    parser.add_argument("--expires", metavar="ISO8601")


def _limits_and_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpm", type=int)
    parser.add_argument("--tpm", type=int)
    parser.add_argument("--concurrent", type=int)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="a field a plugin reads (a budget, say), as JSON (see docs/administration.md)",
    )


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--label {pair!r}: NAME=VALUE")
        labels[name] = value
    return labels


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if getattr(args, "models", None):
        spec["models"] = args.models
    if getattr(args, "endpoints", None):
        spec["endpoints"] = args.endpoints
    if args.label:
        spec["labels"] = _labels(args.label)
    limits = {name: value for name in ("rpm", "tpm", "concurrent") if (value := getattr(args, name)) is not None}
    if limits:
        spec["limits"] = limits
    for pair in args.set:
        field, sep, value = pair.partition("=")
        try:
            spec[field] = json.loads(value)
        except ValueError:
            raise SystemExit(f"--set {field}: not JSON") from None
        if not sep:
            raise SystemExit(f"--set {pair!r}: FIELD=JSON")
    if getattr(args, "expires", None):
        spec["expires_at"] = args.expires
    return spec


def request_of(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    """The admin API call a command is: (method, path with its query, body, headers)."""
    quote = urllib.parse.quote
    command, action = args.command, getattr(args, "action", None)
    if command == "audit":
        query = {
            k: v
            for k, v in (
                ("tenant", args.tenant),
                ("target", args.target),
                ("actor", args.actor),
                ("limit", str(args.limit)),
            )
            if v is not None
        }
        return "GET", "/audit?" + urllib.parse.urlencode(query), None, {}
    if command == "admin-token":
        if action == "create":
            return (
                "POST",
                "/admin-tokens",
                {"name": args.name, "role": args.role, "tenant": args.tenant, "expires_at": args.expires},
                {},
            )
        if action == "list":
            return "GET", "/admin-tokens", None, {}
        return "DELETE", f"/admin-tokens/{quote(args.name, safe='')}", None, {}
    if command == "tenants":
        if action == "list":
            return "GET", "/tenants", None, {}
        path = f"/tenants/{quote(args.name, safe='')}"
        if action == "create":
            return "POST", "/tenants", {"name": args.name, **_settings(args)}, {}
        if action == "update":
            return "PATCH", path, _settings(args), {}
        if action == "usage":
            return "GET", path + "/usage", None, {}
        return ("GET" if action == "show" else "DELETE"), path, None, {}
    if action == "list":
        query = {k: v for k, v in (("tenant", args.tenant), ("label", args.label), ("state", args.state)) if v}
        return "GET", "/keys" + ("?" + urllib.parse.urlencode(query) if query else ""), None, {}
    if action == "create":
        headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
        body = {"name": args.name, **({"tenant": args.tenant} if args.tenant else {}), **_settings(args)}
        return "POST", "/keys", body, headers
    path = f"/keys/{quote(args.name, safe='')}"
    if action == "update":
        return "PATCH", path, _settings(args), {}
    if action == "rotate":
        return "POST", path + "/rotate", {"grace_s": args.grace_s}, {}
    if action in ("disable", "enable"):
        return "POST", f"{path}/{action}", None, {}
    if action == "usage":
        return "GET", path + "/usage", None, {}
    return ("GET" if action == "show" else "DELETE"), path, None, {}


def run(args: argparse.Namespace, config: Any | None) -> int:
    """Run a command; `config` is the loaded GatewayConfig when -c names one."""
    method, path, body, headers = request_of(args)
    if config is not None:
        status, answer = asyncio.run(_direct(config, method, path, body, headers))
    elif args.admin_url and args.admin_token:
        status, answer = _over_http(args.admin_url, args.admin_token, method, path, body, headers)
    else:
        print("name the gateway (--admin-url and --admin-token) or its config (-c CONFIG)", file=sys.stderr)
        return 1
    if status >= 400:
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        field = f" ({error['field']})" if error.get("field") else ""
        print(f"{status} {error.get('code', 'error')}: {error.get('message', answer)}{field}", file=sys.stderr)
        return 2 if status >= 500 else 1
    secret = answer.pop("secret", None) if isinstance(answer, dict) else None
    print(json.dumps(answer, indent=2))
    if secret:
        print(secret)
    return 0


def _over_http(
    url: str, token: str, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
) -> tuple[int, Any]:
    from proxy.keystore.api import PREFIX

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url.rstrip("/") + PREFIX + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (an operator's own URL)
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {"error": {"code": "http_error", "message": exc.reason}}
    except (urllib.error.URLError, OSError) as exc:
        return 503, {"error": {"code": "unreachable", "message": f"{url}: {exc}"}}


async def _direct(
    config: Any, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
) -> tuple[int, Any]:
    """The same call, made to the admin API served for it alone: on a loopback port of its own,
    against the store itself, for one token made for this call (the caller is an owner)."""
    import hmac
    import secrets

    from aiohttp import web

    from proxy.keystore.api import PREFIX, AdminApi
    from proxy.keystore.operations import AdminOps
    from proxy.keystore.store import KeyStore

    if not config.key_store.database_url:
        return 400, {"error": {"code": "no_key_store", "message": "the config names no key_store.database_url"}}
    token = secrets.token_urlsafe(32)
    store = KeyStore(config.key_store.database_url, config.key_store.timeout_s)
    api = AdminApi(
        AdminOps(store, lambda: config.keys, reporters=None),
        lambda request: hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"),
        owner=f"cli:{getpass.getuser()}",
    )
    app = web.Application()
    for route_method, route_path, handler in api.routes():
        app.router.add_route(route_method, PREFIX + route_path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    try:
        return await asyncio.to_thread(_over_http, f"http://127.0.0.1:{port}", token, method, path, body, headers)
    finally:
        await runner.cleanup()
        await store.close()
