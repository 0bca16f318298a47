"""Who may do what through the admin API.

| role | keys | tenants | admin tokens | audit | usage (requests, spend) | channels |
|---|---|---|---|---|---|---|
| `owner` | all | all | all | all | all | read |
| `operator` | all | all | none | all | all | read |
| `viewer` | read | read | none | all | all | read |
| `tenant-admin` | its tenant's | read its own | none | its tenant's | its tenant's | none |

`server.admin_token` is an `owner`; other admin tokens are made with
`modelgate admin-token create` and kept as digests in the key store. An attempt a role does not
allow is answered 403 and written to the audit trail as `denied`.
"""

from __future__ import annotations

from proxy.keystore.records import Actor

READ = "read"
WRITE = "write"


def allowed(actor: Actor, kind: str, mode: str, tenant: str | None) -> bool:
    """Whether `actor` may `mode` (READ or WRITE) a `kind` ("key", "tenant", "admin_token",
    "audit", "usage", "channel") belonging to `tenant` (None: no tenant, or every tenant at once, as a list is)."""
    role = actor.role
    if role == "owner":
        return True
    if kind == "admin_token":
        return False
    if role == "operator":
        return True
    if role == "viewer":
        return mode == READ
    if role == "tenant-admin":
        if actor.tenant is None or tenant != actor.tenant:
            return False
        return kind in ("key", "audit") or (kind in ("tenant", "usage") and mode == READ)
    return False
