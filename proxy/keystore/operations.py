"""What the admin API and the CLI do, once it is known who asks (`Actor`): each operation checks
the role (proxy/keystore/access.py), validates what it is given as the config file's keys are
validated, changes the store, and answers a JSON-ready dict; or raises `AdminError` with the
status, a code, a message and the path of the field at fault.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from proxy.core.plugin import Plugin, Subject
from proxy.keystore.access import READ, WRITE, allowed
from proxy.keystore.records import Actor, SpecProblem, checked_spec, checked_tenant_spec
from proxy.keystore.roles import ROLES
from proxy.keystore.store import Conflict, KeyStore, NotFound
from proxy.policy.keys import gateway_key

log = logging.getLogger("modelgate.admin")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_UNSET = object()
_IDEMPOTENCY = re.compile(r"[\x21-\x7e]{1,200}")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
_LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


class AdminError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


def _name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise AdminError(
            400, "invalid_field", "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", field
        )
    return value


def _path_name(name: str) -> None:
    """A name in a path that no record can have is answered 404 without asking the store."""
    if not _NAME.fullmatch(name):
        raise AdminError(404, "not_found", "no such record: a name is 1-64 letters, digits, '.', '_' or '-'")


def _merged(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` merged into `spec`, objects field by field (`limits: {rpm: 5}` keeps `tpm`);
    a field set to null goes back to its default."""
    out = dict(spec)
    for field, value in changes.items():
        if value is None:
            out.pop(field, None)
        elif isinstance(value, dict) and isinstance(out.get(field), dict):
            out[field] = _merged(out[field], value)
        else:
            out[field] = value
    return out


def _labels(value: Any, field: str = "labels") -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise AdminError(400, "invalid_field", "an object of text values", field)
    return value


def _tenant_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A tenant's settings (limits, plugins' tenant fields) as given, once they validate."""
    try:
        checked_tenant_spec(spec)
    except SpecProblem as exc:
        raise AdminError(400, "invalid_field", exc.message, exc.field or None) from None
    return spec


def _spec(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    try:
        entry = checked_spec(name, spec)
    except SpecProblem as exc:
        raise AdminError(400, "invalid_field", exc.message, exc.field or None) from None
    if "tenant" in entry.labels:
        raise AdminError(
            400, "invalid_field", "a stored key's tenant is its `tenant` field, not a label", "labels.tenant"
        )
    return entry.model_dump(mode="json", exclude={"name", "key", "sha256"}, exclude_unset=True)


class AdminOps:
    """The operations, over one KeyStore; `configured` names the config file's keys (read only here)."""

    def __init__(
        self, store: KeyStore, configured: Callable[[], list[Any]], reporters: Callable[[], list[Plugin]] | None = None
    ) -> None:
        self.store = store
        self.configured = configured
        # The running config's plugins, asked what they know of a key or tenant (None: no gateway
        # runs here, as for the CLI's -c, and usage reads are refused).
        self.reporters = reporters

    async def check(
        self, actor: Actor, kind: str, mode: str, tenant: str | None, action: str, target: str | None = None
    ) -> None:
        if not allowed(actor, kind, mode, tenant):
            # Every attempt is kept, a read as a change: in the trail of the tenant the caller is
            # held to (a tenant-admin's attempts are its own tenant's to see), not of the one it tried.
            scope = actor.tenant if actor.role == "tenant-admin" else tenant
            await self.store.record(actor, action, "denied", kind=kind, target=target, tenant=scope)
            raise AdminError(403, "forbidden", f"role '{actor.role}' may not {mode} this {kind.replace('_', ' ')}")

    # --- keys ---

    async def list_keys(
        self, actor: Actor, tenant: str | None = None, label: str | None = None, state: str | None = None
    ) -> dict[str, Any]:
        if actor.role == "tenant-admin":
            tenant = tenant or actor.tenant
        await self.check(actor, "key", READ, tenant, "key.list")
        now = datetime.now(timezone.utc)
        keys = [key.view(now) for key in await self.store.keys(tenant)]
        if actor.role != "tenant-admin":  # the config's keys too, by their `tenant` label when one is asked for
            keys += [
                _configured_view(entry, now)
                for entry in self.configured()
                if tenant is None or entry.labels.get("tenant") == tenant
            ]
        if label is not None:
            name, _, value = label.partition("=")
            keys = [k for k in keys if (k.get("labels") or {}).get(name) == value]
        if state is not None:
            keys = [k for k in keys if k["state"] == state]
        return {"keys": sorted(keys, key=lambda k: k["name"])}

    async def get_key(self, actor: Actor, name: str) -> dict[str, Any]:
        configured = self._configured(actor, name)
        if configured is not None:
            await self.check(actor, "key", READ, None, "key.read", name)
            return _configured_view(configured, datetime.now(timezone.utc))
        key = await self._stored(actor, name)
        await self.check(actor, "key", READ, key.tenant, "key.read", name)
        return key.view(datetime.now(timezone.utc))

    async def create_key(self, actor: Actor, body: Any, idempotency_key: str | None = None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise AdminError(400, "invalid_body", 'a JSON object: {"name": ..., "tenant": ..., ...}')
        fields = dict(body)
        name = _name(fields.pop("name", None))
        tenant = fields.pop("tenant", None)
        if tenant is not None:
            _name(tenant, "tenant")
        if actor.role == "tenant-admin" and tenant is None:
            tenant = actor.tenant
        await self.check(actor, "key", WRITE, tenant, "key.create", name)
        if name in {entry.name for entry in self.configured()}:
            raise AdminError(409, "name_taken", "a key of the config file has this name", "name")
        if idempotency_key is not None and not _IDEMPOTENCY.fullmatch(idempotency_key):
            raise AdminError(400, "invalid_field", "1-200 visible ASCII characters", "Idempotency-Key")
        spec = _spec(name, fields)
        try:
            key, secret = await self.store.create_key(actor, name, tenant, spec, idempotency_key)
        except Conflict as exc:
            raise AdminError(409, "conflict", str(exc), "tenant" if "tenant" in str(exc) else "name") from None
        view = key.view(datetime.now(timezone.utc))
        if secret is None:  # the create was made before, under this idempotency key
            return {**view, "secret": None, "replayed": True}
        return {**view, "secret": secret}

    async def update_key(self, actor: Actor, name: str, body: Any) -> dict[str, Any]:
        """Merge `body` into the key's settings; a field set to null goes back to its default."""
        if not isinstance(body, dict):
            raise AdminError(400, "invalid_body", "a JSON object of the settings to change")
        for fixed in ("name", "tenant"):
            if fixed in body:
                raise AdminError(400, "invalid_field", f"a key's {fixed} cannot change: make a new key", fixed)
        return await self._change(actor, name, "key.update", body)

    async def set_enabled(self, actor: Actor, name: str, enabled: bool) -> dict[str, Any]:
        return await self._change(actor, name, "key.enable" if enabled else "key.disable", {"enabled": enabled})

    async def _change(self, actor: Actor, name: str, action: str, changes: dict[str, Any]) -> dict[str, Any]:
        key = await self._stored(actor, name)
        await self.check(actor, "key", WRITE, key.tenant, action, name)
        spec = _merged(key.spec, changes)
        try:
            stored = await self.store.update_key(actor, name, action, _spec(name, spec))
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None
        return stored.view(datetime.now(timezone.utc))

    async def rotate_key(self, actor: Actor, name: str, body: Any) -> dict[str, Any]:
        grace = (body or {}).get("grace_s", 0) if isinstance(body, dict) or body is None else _UNSET
        if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not 0 <= grace <= 30 * 86_400:
            raise AdminError(400, "invalid_field", "seconds the old secret keeps working: 0 to 2592000", "grace_s")
        key = await self._stored(actor, name)
        await self.check(actor, "key", WRITE, key.tenant, "key.rotate", name)
        try:
            stored, secret = await self.store.rotate_key(actor, name, float(grace))
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None
        return {**stored.view(datetime.now(timezone.utc)), "secret": secret}

    async def delete_key(self, actor: Actor, name: str) -> dict[str, Any]:
        key = await self._stored(actor, name)
        await self.check(actor, "key", WRITE, key.tenant, "key.delete", name)
        try:
            await self.store.delete_key(actor, name)
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None
        return {"name": name, "deleted": True}

    def _configured(self, actor: Actor, name: str) -> Any:
        """The config file's key of that name, for a caller who may know of it (not a tenant-admin:
        the config's keys are no tenant's to manage, and their names no tenant's to learn)."""
        if actor.role == "tenant-admin":
            return None
        return next((entry for entry in self.configured() if entry.name == name), None)

    async def _stored(self, actor: Actor, name: str) -> Any:
        _path_name(name)
        try:
            return await self.store.key(name)
        except NotFound:
            if self._configured(actor, name) is not None:
                raise AdminError(
                    409, "configured_key", f"'{name}' is a key of the config file, read only here: change it there"
                ) from None
            raise AdminError(404, "not_found", f"no key named '{name}'") from None

    async def key_usage(self, actor: Actor, name: str) -> dict[str, Any]:
        """What the plugins know of a key now: its spend (the ledger), its budgets' windows."""
        configured = self._configured(actor, name)
        if configured is not None:
            await self.check(actor, "key", READ, None, "key.usage", name)
            key = gateway_key(configured)
        else:
            stored = await self._stored(actor, name)
            await self.check(actor, "key", READ, stored.tenant, "key.usage", name)
            try:
                key = stored.gateway_key()
            except ValueError:  # written by a newer release, or by hand: not served, so nothing to read
                raise AdminError(409, "key_not_served", f"'{name}' does not validate here and is not served") from None
        return {
            "name": name,
            "tenant": key.tenant.removeprefix("tenant:") if key.tenant.startswith("tenant:") else None,
            **await self._reports(Subject(name, key.tenant, key)),
        }

    async def tenant_usage(self, actor: Actor, name: str) -> dict[str, Any]:
        """What the plugins know of a tenant (every key of it together) now."""
        _path_name(name)
        await self.check(actor, "tenant", READ, name, "tenant.usage", name)
        await self._tenant(name)
        return {"name": name, **await self._reports(Subject(name, f"tenant:{name}"))}

    async def _reports(self, subject: Subject) -> dict[str, Any]:
        if self.reporters is None:
            raise AdminError(
                400,
                "needs_a_gateway",
                "spend and budgets are read by a running gateway's plugins: "
                "ask one (--admin-url), not the key store (-c)",
            )
        reports = {}
        for plugin in self.reporters():
            try:
                found = await plugin.report(subject)
            except Exception:  # one plugin's failure is said in its place, not a 500 for all
                log.exception("a plugin's report failed", extra={"plugin": plugin.name})
                found = {"unavailable": "this plugin could not report; see the gateway's log"}
            if found is not None:
                reports[plugin.name] = found
        return {"at": datetime.now(timezone.utc).isoformat(), "reports": reports}

    # --- tenants ---

    async def list_tenants(self, actor: Actor) -> dict[str, Any]:
        if actor.role == "tenant-admin":
            await self.check(actor, "tenant", READ, actor.tenant, "tenant.list")
            return {"tenants": [(await self._tenant(actor.tenant or "")).view()]}
        await self.check(actor, "tenant", READ, None, "tenant.list")
        return {"tenants": [tenant.view() for tenant in await self.store.tenants()]}

    async def get_tenant(self, actor: Actor, name: str) -> dict[str, Any]:
        _path_name(name)
        await self.check(actor, "tenant", READ, name, "tenant.read", name)
        return (await self._tenant(name)).view()

    async def create_tenant(self, actor: Actor, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise AdminError(
                400, "invalid_body", 'a JSON object: {"name": ..., "labels": {...}, "limits": {...}, "budget": {...}}'
            )
        fields = dict(body)
        name = _name(fields.pop("name", None))
        labels = _labels(fields.pop("labels", {}))
        await self.check(actor, "tenant", WRITE, name, "tenant.create", name)
        try:
            return (await self.store.create_tenant(actor, name, labels, _tenant_spec(fields))).view()
        except Conflict as exc:
            raise AdminError(409, "conflict", str(exc), "name") from None

    async def update_tenant(self, actor: Actor, name: str, body: Any) -> dict[str, Any]:
        """New labels (given whole), and settings merged into the tenant's (null resets one)."""
        _path_name(name)
        if not isinstance(body, dict):
            raise AdminError(400, "invalid_body", 'a JSON object: {"labels": {...}, "limits": {...}, ...}')
        if "name" in body:
            raise AdminError(400, "invalid_field", "a tenant's name cannot change", "name")
        await self.check(actor, "tenant", WRITE, name, "tenant.update", name)
        tenant = await self._tenant(name)
        changes = dict(body)
        labels = _labels(changes.pop("labels")) if "labels" in changes else tenant.labels
        spec = _tenant_spec(_merged(tenant.spec, changes))
        return (await self.store.update_tenant(actor, name, labels, spec)).view()

    async def delete_tenant(self, actor: Actor, name: str) -> dict[str, Any]:
        _path_name(name)
        await self.check(actor, "tenant", WRITE, name, "tenant.delete", name)
        try:
            await self.store.delete_tenant(actor, name)
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None
        except Conflict as exc:
            raise AdminError(409, "conflict", str(exc)) from None
        return {"name": name, "deleted": True}

    async def _tenant(self, name: str) -> Any:
        try:
            return await self.store.tenant(name)
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None

    # --- admin tokens, audit ---

    async def create_admin_token(self, actor: Actor, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise AdminError(400, "invalid_body", 'a JSON object: {"name": ..., "role": ..., "tenant": ...}')
        name = _name(body.get("name"))
        role, tenant = body.get("role"), body.get("tenant")
        if role not in ROLES:
            raise AdminError(400, "invalid_field", f"one of {', '.join(ROLES)}", "role")
        if (role == "tenant-admin") != (tenant is not None):
            raise AdminError(
                400, "invalid_field", "a tenant-admin token names its tenant; no other role does", "tenant"
            )
        if tenant is not None:
            _name(tenant, "tenant")
        expires = body.get("expires_at")
        try:
            expires_at = datetime.fromisoformat(expires) if expires is not None else None
        except (TypeError, ValueError):
            raise AdminError(400, "invalid_field", "an ISO 8601 time", "expires_at") from None
        if expires_at is not None and expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=timezone.utc)
        if expires_at is not None and not datetime.now(timezone.utc) < expires_at < _LATEST:
            raise AdminError(400, "invalid_field", "a time ahead, before the year 9000", "expires_at")
        await self.check(actor, "admin_token", WRITE, tenant, "admin_token.create", name)
        try:
            secret = await self.store.create_admin_token(actor, name, role, tenant, expires_at)
        except Conflict as exc:
            raise AdminError(409, "conflict", str(exc), "tenant" if "tenant" in str(exc) else "name") from None
        return {"name": name, "role": role, "tenant": tenant, "expires_at": expires, "secret": secret}

    async def list_admin_tokens(self, actor: Actor) -> dict[str, Any]:
        await self.check(actor, "admin_token", READ, None, "admin_token.list")
        return {"admin_tokens": await self.store.admin_tokens()}

    async def delete_admin_token(self, actor: Actor, name: str) -> dict[str, Any]:
        _path_name(name)
        await self.check(actor, "admin_token", WRITE, None, "admin_token.delete", name)
        try:
            await self.store.delete_admin_token(actor, name)
        except NotFound as exc:
            raise AdminError(404, "not_found", str(exc)) from None
        return {"name": name, "deleted": True}

    async def audit(
        self,
        actor: Actor,
        tenant: str | None = None,
        target: str | None = None,
        by: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> dict[str, Any]:
        if actor.role == "tenant-admin":
            tenant = tenant or actor.tenant
        await self.check(actor, "audit", READ, tenant, "audit.read")
        if not 1 <= limit <= 1000:
            raise AdminError(400, "invalid_field", "1 to 1000", "limit")
        if before is not None and not 1 <= before < 2**63:
            raise AdminError(400, "invalid_field", "an entry's id", "before")
        for field, value in (("tenant", tenant), ("target", target), ("actor", by)):
            if value is not None and not _TEXT.fullmatch(value):
                raise AdminError(400, "invalid_field", "1-200 characters, no control characters", field)
        entries = await self.store.audit(tenant=tenant, target=target, actor=by, limit=limit, before_id=before)
        return {"entries": entries, "next_before": entries[-1]["id"] if len(entries) == limit else None}


def _configured_view(entry: Any, now: datetime) -> dict[str, Any]:
    """A config file's key as the API lists it: read only, and said to be so."""
    state = "disabled" if not entry.enabled else "expired" if entry.expires_at and entry.expires_at <= now else "active"
    return {
        "name": entry.name,
        "source": "config",
        "tenant": entry.labels.get("tenant"),
        "state": state,
        "labels": entry.labels,
        "models": entry.models,
        "endpoints": entry.endpoints,
        "fingerprint": entry.digest_hex()[:8],
    }
