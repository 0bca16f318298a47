"""The console in a real browser (Playwright driving Debian's headless Chromium) through a real
gateway with PostgreSQL and Redis: sign in, make a key and use it with the openai SDK, find the
request, disable the key; a tenant-admin's view; CSRF; OIDC sign-in; nothing fetched from any
origin but the gateway's. Each page is saved as a 1280x800 screenshot in the artefacts folder
(docs/console.md shows them)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, running_provider
from tests.polling import within

pytestmark = [pytest.mark.xdist_group("browser")]  # one Chromium at a time: it wants most of a core

CHROMIUM = "/usr/bin/chromium"
OWNER = "owner-token-console-0123456789"
ARTEFACTS = Path(os.environ.get("MODELGATE_ARTIFACTS", Path(__file__).parent.parent / "artifacts")) / "console"
PRICES = """
prices:
  - {model: "respmodel-*", input_per_mtok: 2.5, output_per_mtok: 10}
"""


def console_config(redis_url: str, database_url: str, prefix: str, oidc: str = "") -> str:
    return f"""
server: {{listen: '127.0.0.1:{{PORT}}', admin_listen: '127.0.0.1:{{ADMIN_PORT}}', admin_token: {OWNER}}}
state: {{backend: redis, url: "{redis_url}", prefix: "{prefix}:"}}
key_store: {{database_url: "{database_url}", resync_s: 3600}}
channels: [{{name: simulator, base_url: simulator, simulator: {{chunk_delay_ms: 0, output_tokens: 12}}}}]
plugins: {{ledger: {{database_url: "{database_url}", flush_interval_s: 0.1, spool_dir: "spool-{prefix}"}}}}
observability: {{logging: {{access_log: false}}, tracing: {{exporter: console}}}}
console: {{trace_url: "https://traces.example/trace/{{trace_id}}"{oidc}}}
{PRICES}
"""


@pytest.fixture
def gateway(spawn, redis_url: str, ledger_db: str, tmp_path: Path):
    return spawn("gateway", config=console_config(redis_url, ledger_db, tmp_path.name))


@asynccontextmanager
async def browser(admin_url: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A page at 1280x800, and every URL it asked for."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        context = await chromium.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        page.set_default_timeout(15_000)
        try:
            yield page, asked
        finally:
            await chromium.close()


async def sign_in(page: Any, admin_url: str, token: str) -> None:
    await page.goto(f"{admin_url}/console/signin")
    await page.fill("input[name=token]", token)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{admin_url}/console/keys")


async def shot(page: Any, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTEFACTS / f"{name}.png"))


async def api(admin_url: str, method: str, path: str, token: str = OWNER, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(
            method, f"{admin_url}/admin/v1{path}", json=body, headers={"Authorization": f"Bearer {token}"}
        ) as answer:
            return answer.status, await answer.json()


async def ask(gateway_url: str, secret: str) -> Any:
    """One call through the openai SDK, as a client given only the base URL and the key makes it."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=secret, max_retries=0)
    try:
        return await client.responses.create(model="respmodel-mini", input="What is a gateway?")
    finally:
        await client.close()


async def test_an_owner_makes_a_key_sees_its_request_and_cost_and_disables_it(gateway) -> None:
    import openai

    admin = gateway.admin
    async with browser(admin) as (page, asked):
        response = await page.goto(f"{admin}/console/keys")
        assert page.url == f"{admin}/console/signin"  # no session: sign in first
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
        await shot(page, "signin")
        await sign_in(page, admin, OWNER)
        assert "admin_token · owner" in await page.inner_text("header")

        await page.goto(f"{admin}/console/tenants")
        await page.fill("details.create input[name=name]", "acme")
        await page.click("details.create button[type=submit]")
        await page.wait_for_url(f"{admin}/console/tenants/acme")

        await page.goto(f"{admin}/console/keys")
        if not await page.is_visible("details.create input[name=name]"):
            await page.click("details.create summary")
        await page.fill("details.create input[name=name]", "web")
        await page.select_option("details.create select[name=tenant]", "acme")
        await page.fill("details.create input[name=models]", "respmodel-*")
        await page.click("details.create button[type=submit]")
        secret = (await page.inner_text("#secret")).strip()
        assert secret.startswith("mg-") and "only time the secret is shown" in await page.inner_text("main")
        assert secret in await page.inner_text("#python")  # the SDK snippet, ready to paste
        await shot(page, "key-created")

        answer = await ask(gateway.url, secret)
        assert answer.output_text and answer.usage.output_tokens == 12

        async def listed() -> bool:
            await page.goto(f"{admin}/console/requests?key=web")
            return await page.locator("table tbody a").count() > 0

        await within(10, listed, "the request on the Requests page", every=0.1)
        row = await page.inner_text("table tbody tr")
        cost = f"{(answer.usage.input_tokens * 2.5 + answer.usage.output_tokens * 10) / 1e6:.6f}"  # the price table's
        assert "web" in row and "respmodel-mini" in row and "200" in row and cost in row
        await shot(page, "requests")
        await page.click("table tbody a")
        main = await page.inner_text("main")
        assert "Gateway" in main and "Upstream" in main and "simulator" in main and "Attempts\n1" in main
        assert (await page.inner_text("#cost")).startswith(cost)
        trace = await page.get_attribute("text=Its trace", "href")
        assert re.fullmatch(r"https://traces\.example/trace/[0-9a-f]{32}", trace or ""), trace
        await shot(page, "request")

        await page.goto(f"{admin}/console/keys/web")
        await shot(page, "key")
        page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.click("form[action='/console/keys/web/disable'] button")
        await page.wait_for_url(f"{admin}/console/keys/web")
        assert "disabled" in await page.inner_text("h1")

        async def refused() -> bool:
            try:
                await ask(gateway.url, secret)
            except openai.AuthenticationError:
                return True
            return False

        await within(10, refused, "the SDK told 401 once the key is disabled", every=0.1)

        for name in ("keys", "tenants", "tenants/acme", "spend", "channels", "admin-tokens", "audit"):
            response = await page.goto(f"{admin}/console/{name}")
            assert response.status == 200, name
            await shot(page, name.replace("/", "-"))
        assert "key.disable" in await page.inner_text("table")  # the audit trail (the last page) names the change

        await page.goto(f"{admin}/console/spend?by=key")
        assert "web" in await page.inner_text("table") and await page.locator("svg.chart rect").count() >= 1
        async with page.expect_download() as download:
            await page.click("text=Download as CSV")
        lines = Path(await (await download.value).path()).read_text().splitlines()
        assert lines[0].startswith("key,requests") and lines[1].startswith("web,")

    origins = {f"{urlsplit(url).scheme}://{urlsplit(url).netloc}" for url in asked}
    assert origins == {admin}, origins  # every page, style sheet and script: the gateway's own


async def test_a_tenant_admin_sees_only_its_tenant_s_keys_spend_and_requests(gateway) -> None:
    admin = gateway.admin
    secrets_by_key = {}
    for tenant, key in (("acme", "acme-web"), ("globex", "globex-batch")):
        assert (await api(admin, "POST", "/tenants", body={"name": tenant}))[0] == 201
        status, made = await api(admin, "POST", "/keys", body={"name": key, "tenant": tenant})
        assert status == 201
        secrets_by_key[key] = made["secret"]
        await ask(gateway.url, made["secret"])
    status, token = await api(
        admin, "POST", "/admin-tokens", body={"name": "acme-ops", "role": "tenant-admin", "tenant": "acme"}
    )
    assert status == 201

    async with browser(admin) as (page, _):
        await sign_in(page, admin, token["secret"])
        assert "tenant-admin of acme" in await page.inner_text("header")
        keys = await page.inner_text("table")
        assert "acme-web" in keys and "globex" not in keys and "demo" not in keys  # nor the config's keys
        await shot(page, "keys-tenant-admin")

        async def both_recorded() -> bool:
            return len((await api(admin, "GET", "/requests"))[1]["requests"]) >= 2

        await within(10, both_recorded, "both requests in the ledger", every=0.1)
        await page.goto(f"{admin}/console/requests")
        rows = await page.inner_text("table")
        assert "acme-web" in rows and "globex" not in rows
        await page.goto(f"{admin}/console/requests?tenant=globex&key=globex-batch")  # asking is not seeing
        assert "globex" not in await page.inner_text("table tbody")
        await page.goto(f"{admin}/console/spend?by=key")
        spend = await page.inner_text("main")
        assert "acme-web" in spend and "globex" not in spend

        response = await page.goto(f"{admin}/console/keys/globex-batch")
        assert response.status == 403
        response = await page.goto(f"{admin}/console/channels")
        assert response.status == 403  # shared upstreams are not a tenant's to watch
        globex_rows = (await api(admin, "GET", "/requests?key=globex-batch"))[1]["requests"]
        response = await page.goto(f"{admin}/console/requests/{globex_rows[0]['request_id']}")
        assert response.status == 404


async def test_a_change_without_the_page_s_csrf_token_is_refused(gateway) -> None:
    admin = gateway.admin
    status, made = await api(admin, "POST", "/keys", body={"name": "web"})
    assert status == 201
    async with browser(admin) as (page, _):
        await sign_in(page, admin, OWNER)
        # The browser's own cookies, a request no console page made: no token, then a wrong one.
        for form in ({}, {"csrf": "not-the-session-s-token"}):
            answer = await page.request.post(f"{admin}/console/keys/web/disable", form=form, max_redirects=0)
            assert answer.status == 403 and "CSRF" in await answer.text()
        # A page of another origin posting to the console: its Origin does not match.
        answer = await page.request.post(
            f"{admin}/console/keys/web/disable",
            max_redirects=0,
            form={"csrf": await page.input_value("input[name=csrf]")},
            headers={"Origin": "https://evil.example"},
        )
        assert answer.status == 403
    assert (await api(admin, "GET", "/keys/web"))[1]["state"] == "active"


async def test_oidc_sign_in_with_a_role_claim(spawn, redis_url: str, ledger_db: str, tmp_path: Path) -> None:
    async with running_provider() as provider:
        oidc = (
            f', oidc: {{issuer: "{provider.url}", client_id: {CLIENT_ID}, client_secret: {CLIENT_SECRET}, '
            'redirect_url: "http://127.0.0.1:{ADMIN_PORT}/console/oidc/callback"}'
        )
        gateway = spawn("gateway", config=console_config(redis_url, ledger_db, tmp_path.name, oidc))
        admin = gateway.admin
        assert (await api(admin, "POST", "/tenants", body={"name": "acme"}))[0] == 201
        assert (await api(admin, "POST", "/keys", body={"name": "acme-web", "tenant": "acme"}))[0] == 201
        assert (await api(admin, "POST", "/keys", body={"name": "other"}))[0] == 201

        async with browser(admin) as (page, _):
            await _oidc_sign_in(page, admin)
            assert "oidc:alice · operator" in await page.inner_text("header")
            assert "other" in await page.inner_text("table") and "acme-web" in await page.inner_text("table")
            form = provider.token_requests[-1]
            assert form["grant_type"] == "authorization_code" and len(form["code_verifier"]) >= 43
            await page.click("header button")  # sign out
            await page.wait_for_url(f"{admin}/console/signin")

            provider.claims = {"sub": "carol", "modelgate_role": "tenant-admin", "modelgate_tenant": "acme"}
            await _oidc_sign_in(page, admin)
            assert "oidc:carol · tenant-admin of acme" in await page.inner_text("header")
            keys = await page.inner_text("table")
            assert "acme-web" in keys and "other" not in keys
            await page.click("header button")

            from joserfc.jwk import RSAKey

            provider.signing_key = RSAKey.generate_key(2048, private=True, parameters={"kid": "console-test"})
            await page.goto(f"{admin}/console/signin")
            await page.click("text=Sign in with your identity provider")
            await page.wait_for_load_state()
            assert "refused" in await page.inner_text("main") and "/console/signin" not in page.url
            await page.goto(f"{admin}/console/keys")
            assert page.url == f"{admin}/console/signin"  # no session came of it
        trail = (await api(admin, "GET", "/audit"))[1]["entries"]
        assert not any(entry["outcome"] == "denied" and entry["actor"] == "oidc:carol" for entry in trail)


async def _oidc_sign_in(page: Any, admin: str) -> None:
    await page.goto(f"{admin}/console/signin")
    await page.click("text=Sign in with your identity provider")
    await page.wait_for_url(re.compile(re.escape(admin) + r"/console/keys$"))
