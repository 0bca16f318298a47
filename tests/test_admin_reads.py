"""The admin API's reads of what the gateway did (`/admin/v1/requests`, `/requests/{id}`, `/spend`,
`/channels`): answered from the ledger, confined to a tenant-admin's tenant whatever it asks, and
a clear 400 for any parameter they cannot take."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import free_port
from tests.test_console_browser import OWNER, ask, console_config


async def call(admin: str, path: str, token: str = OWNER) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{admin}/admin/v1{path}", headers={"Authorization": f"Bearer {token}"}) as answer:
            return answer.status, await answer.json()


async def post(admin: str, path: str, body: Any) -> Any:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{admin}/admin/v1{path}", json=body, headers={"Authorization": f"Bearer {OWNER}"}
        ) as answer:
            assert answer.status == 201, await answer.text()
            return await answer.json()


async def recorded(admin: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        status, found = await call(admin, "/requests?limit=200")
        assert status == 200, found
        if len(found["requests"]) >= count or time.monotonic() > deadline:
            return found["requests"]
        await asyncio.sleep(0.1)


@pytest.fixture
async def two_tenants(spawn, redis_url: str, ledger_db: str, tmp_path: Path):
    gateway = spawn("gateway", config=console_config(redis_url, ledger_db, tmp_path.name))
    secrets = {}
    for tenant in ("acme", "globex"):
        await post(gateway.admin, "/tenants", {"name": tenant})
        secrets[tenant] = (await post(gateway.admin, "/keys", {"name": f"{tenant}-key", "tenant": tenant}))["secret"]
    for tenant, count in (("acme", 2), ("globex", 3)):
        for _ in range(count):
            await ask(gateway.url, secrets[tenant])
    acme_admin = (
        await post(gateway.admin, "/admin-tokens", {"name": "acme-ops", "role": "tenant-admin", "tenant": "acme"})
    )["secret"]
    await recorded(gateway.admin, 5)
    return gateway, acme_admin


async def test_requests_and_spend_are_the_ledger_s_and_a_tenant_admin_sees_its_tenant_s_alone(two_tenants) -> None:
    gateway, acme = two_tenants
    rows = await recorded(gateway.admin, 5)
    assert sorted(r["key_name"] for r in rows) == ["acme-key"] * 2 + ["globex-key"] * 3
    one = rows[0]
    status, found = await call(gateway.admin, f"/requests/{one['request_id']}")
    assert status == 200 and found["request"]["attempts"] == 1 and found["request"]["upstream_ms"] > 0
    assert found["request"]["gateway_ms"] >= 0 and found["request"]["channel"] == "simulator"

    status, spend = await call(gateway.admin, "/spend?by=tenant,day&since=1d")
    assert status == 200
    assert {r["tenant"]: r["requests"] for r in spend["rows"]} == {"tenant:acme": 2, "tenant:globex": 3}
    assert sum(r["cost"] for r in spend["rows"]) == pytest.approx(sum(r["cost"] for r in rows))

    for asked in ("", "?tenant=globex", "?key=globex-key", "?tenant=acme&key=globex-key"):
        status, found = await call(gateway.admin, f"/requests{asked}", acme)
        assert status == 200 and {r["tenant"] for r in found["requests"]} <= {"tenant:acme"}, asked
    status, spend = await call(gateway.admin, "/spend?by=key&since=7d", acme)
    assert status == 200 and [r["key"] for r in spend["rows"]] == ["acme-key"]
    globex_row = next(r for r in rows if r["key_name"] == "globex-key")
    assert (await call(gateway.admin, f"/requests/{globex_row['request_id']}", acme))[0] == 404
    assert (await call(gateway.admin, "/channels", acme))[0] == 403  # shared upstreams: not a tenant's

    status, channels = await call(gateway.admin, "/channels")
    simulator = next(c for c in channels["channels"] if c["name"] == "simulator")
    assert status == 200 and simulator["breaker"] == "closed" and simulator["recent"]["requests"] == 5

    # Paging: two at a time, newest first, every row once.
    seen, before = [], ""
    while True:
        status, page = await call(gateway.admin, f"/requests?limit=2{before}")
        seen += page["requests"]
        if page["next"] is None:
            break
        before = f"&before={page['next']}"
    assert [r["request_id"] for r in seen] == [r["request_id"] for r in rows]


REFUSED = [
    ("/requests?status=abc", "status"),
    ("/requests?status=6xx", "status"),
    ("/requests?since=yesterday", "since"),
    ("/requests?until=9999999d", "until"),
    ("/requests?limit=0", "limit"),
    ("/requests?limit=201", "limit"),
    ("/requests?before=garbage", "before"),
    ("/requests?model=%00", "model"),
    ("/requests?key=" + "k" * 300, "key"),
    ("/requests?request_id=%0a", "request_id"),
    ("/spend?by=password", "by"),
    ("/spend?by=day,key,model,route", "by"),
    ("/spend?since=1d&until=2000-01-01", "since"),
    ("/requests?tenant=%1b", "tenant"),
]


async def test_a_parameter_the_reads_cannot_take_is_a_400_naming_it(two_tenants) -> None:
    gateway, _ = two_tenants
    for path, field in REFUSED:
        status, found = await call(gateway.admin, path)
        assert status == 400 and found["error"]["field"] == field, (path, found)


async def test_the_reads_say_503_while_the_ledger_s_database_is_away(
    spawn, redis_url: str, ledger_db: str, tmp_path: Path
) -> None:
    away = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    config = console_config(redis_url, ledger_db, tmp_path.name).replace(
        f'plugins: {{ledger: {{database_url: "{ledger_db}"', f'plugins: {{ledger: {{database_url: "{away}"'
    )
    gateway = spawn("gateway", config=config)
    for path in ("/requests", "/spend", "/requests/some-id"):
        status, found = await call(gateway.admin, path)
        assert status == 503 and found["error"]["code"] == "records_unavailable", (path, found)
    status, found = await call(gateway.admin, "/channels")  # what this instance knows itself still answers
    assert status == 200 and found["channels"][0]["recent"]["span_s"] is None
