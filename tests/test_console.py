"""The console as a hostile visitor meets it, over plain HTTP: sessions that end with their
token, forms read whole however they arrive, a 400 for anything a page cannot take, sign-out and
sign-in that another site cannot force, a guessing client turned away."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from tests.test_console_browser import OWNER, api, gateway  # noqa: F401 (the fixture)


async def signed_in(admin: str, token: str = OWNER) -> tuple[aiohttp.ClientSession, str]:
    """A client with a console session, and the session's CSRF token."""
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    form = await (await http.get(f"{admin}/console/signin")).text()
    answer = await http.post(
        f"{admin}/console/signin",
        headers={"Origin": admin},
        data={"csrf": re.search(r'name="csrf" value="([^"]+)"', form)[1], "token": token},
    )
    page = await answer.text()
    assert answer.status == 200 and answer.url.path == "/console/keys", page[-400:]
    return http, re.search(r'name="csrf" value="([^"]+)"', page)[1]


async def test_a_session_ends_with_its_token_and_the_stale_cookie_is_dropped_not_looped(gateway) -> None:
    status, made = await api(gateway.admin, "POST", "/admin-tokens", body={"name": "ops", "role": "operator"})
    assert status == 201
    http, _ = await signed_in(gateway.admin, made["secret"])
    async with http:
        assert (await http.get(f"{gateway.admin}/console/keys")).url.path == "/console/keys"
        assert (await api(gateway.admin, "DELETE", "/admin-tokens/ops"))[0] == 200
        answer = await http.get(f"{gateway.admin}/console/keys", max_redirects=3)
        assert answer.url.path == "/console/signin" and answer.status == 200  # no loop back to /keys
        assert "modelgate_console" not in {c.key for c in http.cookie_jar}


async def test_a_form_that_arrives_in_pieces_is_read_whole(gateway) -> None:
    http, csrf = await signed_in(gateway.admin)
    async with http:
        cookie = "; ".join(f"{c.key}={c.value}" for c in http.cookie_jar)
        body = f"csrf={csrf}&name=split&tenant=&models=respmodel-mini&expires_at=2031-01-01T00:00&settings=".encode()
        host, port = gateway.admin.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /console/keys HTTP/1.1\r\nHost: {host}:{port}\r\nOrigin: {gateway.admin}\r\nCookie: {cookie}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + body[:40])
        await writer.drain()
        await asyncio.sleep(0.3)  # the rest a moment later, as a slow network delivers it
        writer.write(body[40:])
        answer = await reader.read()
        writer.close()
        assert b" 200 " in answer.split(b"\r\n", 1)[0]
    status, key = await api(gateway.admin, "GET", "/keys/split")
    assert status == 200 and key["models"] == ["respmodel-mini"] and key["expires_at"].startswith("2031-01-01")


UNTAKEABLE = [
    ("GET", "/console/requests?before=%C2%B2_abc", None),
    ("GET", "/console/requests?before=999999999999999999_abc", None),
    ("GET", "/console/audit?before=%C2%B2", None),
    ("GET", "/console/keys?tenant=%00", None),
    ("GET", "/console/requests?status=9xx", None),
    ("GET", "/console/spend?since=forever", None),
    ("POST", "/console/keys/web/rotate", {"grace_s": "²"}),
    ("POST", "/console/keys/web/rotate", {"grace_s": "9" * 5000}),
    ("POST", "/console/keys", {"name": "bad", "settings": '{"labels": {"a\\u0000": "b"}}'}),
    ("POST", "/console/keys", {"name": "bad", "settings": '{"limits": {"requests_per_minute": 5}}'}),
    ("POST", "/console/keys", {"name": "bad", "settings": "[1, 2"}),
]


async def test_what_a_page_cannot_take_is_a_400_never_a_500_nor_a_pretend_outage(gateway) -> None:
    assert (await api(gateway.admin, "POST", "/keys", body={"name": "web"}))[0] == 201
    http, csrf = await signed_in(gateway.admin)
    async with http:
        for method, path, form in UNTAKEABLE:
            answer = await http.request(
                method,
                gateway.admin + path,
                headers={"Origin": gateway.admin},
                data={**form, "csrf": csrf} if form is not None else None,
            )
            page = await answer.text()
            assert answer.status == 400, (method, path, answer.status, page[-600:])
            if "requests_per_minute" in str(form):
                assert "limits.requests_per_minute" in page  # the field at fault is named


async def test_a_sign_in_form_the_console_cannot_read_is_a_400(gateway) -> None:
    async with aiohttp.ClientSession() as http:
        for body in (b"csrf=x&token=\xff\xfe", b"token=" + b"a" * 70_000):
            answer = await http.post(
                f"{gateway.admin}/console/signin",
                data=body,
                headers={"Origin": gateway.admin, "Content-Type": "application/x-www-form-urlencoded"},
            )
            assert answer.status == 400 and "form" in await answer.text()


async def test_another_site_can_neither_sign_a_visitor_out_nor_in(gateway) -> None:
    http, csrf = await signed_in(gateway.admin)
    async with http:
        # A cross-site form carries no session cookie (SameSite=Lax): nothing to end, nothing cleared.
        async with aiohttp.ClientSession() as stranger:
            answer = await stranger.post(
                f"{gateway.admin}/console/signout", allow_redirects=False, headers={"Origin": "https://evil.example"}
            )
            assert answer.status == 303 and "Set-Cookie" not in answer.headers
        answer = await http.post(
            f"{gateway.admin}/console/signout",
            data={"csrf": csrf},
            headers={"Origin": "https://evil.example"},
            allow_redirects=False,
        )
        assert answer.status == 403  # with the cookie, but from elsewhere
        assert (await http.get(f"{gateway.admin}/console/keys")).url.path == "/console/keys"
        answer = await http.post(
            f"{gateway.admin}/console/signout",
            data={"csrf": csrf},
            headers={"Origin": gateway.admin},
            allow_redirects=False,
        )
        assert answer.status == 303 and "modelgate_console=" in answer.headers["Set-Cookie"]


async def test_a_caller_s_request_id_is_taken_only_when_plain_and_a_guessing_address_is_turned_away(gateway) -> None:
    assert (await api(gateway.admin, "POST", "/keys", body={"name": "web"}))[0] == 201
    http, csrf = await signed_in(gateway.admin)
    async with http:
        for given in ("x" * 7000, 'fake","actor":"admin_token', "日本語", "plain-id.1"):
            await http.post(
                f"{gateway.admin}/console/keys/web/disable",
                data={"csrf": csrf},
                headers={"Origin": gateway.admin, "X-Request-Id": given.encode().decode("latin-1")},
            )
    entries: list[dict[str, Any]] = (await api(gateway.admin, "GET", "/audit?target=web"))[1]["entries"]
    ids = [e["request_id"] for e in entries if e["action"] == "key.disable"]
    assert len(ids) == 4 and "plain-id.1" in ids and all(re.fullmatch(r"[A-Za-z0-9._-]{1,64}", i) for i in ids)

    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        statuses = []
        for _ in range(12):
            form = await (await http.get(f"{gateway.admin}/console/signin")).text()
            answer = await http.post(
                f"{gateway.admin}/console/signin",
                headers={"Origin": gateway.admin},
                data={"csrf": re.search(r'name="csrf" value="([^"]+)"', form)[1], "token": "not-it-0123456789"},
            )
            statuses.append(answer.status)
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
        answer = await http.post(
            f"{gateway.admin}/console/signin",
            headers={"Origin": gateway.admin},
            data={"csrf": re.search(r'name="csrf" value="([^"]+)"', form)[1], "token": OWNER},
        )
        assert answer.status == 429  # the right token too, until the window has passed
    assert "wrong tokens from one address" in gateway.log.read_text()


async def test_behind_a_proxy_that_ends_tls_changes_come_from_its_origin_and_cookies_are_secure(
    spawn, redis_url: str, ledger_db: str, tmp_path
) -> None:
    from tests.test_console_browser import console_config

    config = console_config(redis_url, ledger_db, tmp_path.name).replace(
        "console: {", 'console: {public_url: "https://gateway-admin.example", '
    )
    admin = spawn("gateway", config=config).admin
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:  # as the browser holds them
        shown = await http.get(f"{admin}/console/signin")
        pre = shown.headers["Set-Cookie"]
        assert "Secure" in pre
        csrf = re.search(r'name="csrf" value="([^"]+)"', await shown.text())[1]
        held = {"Cookie": pre.split(";", 1)[0]}
        own = await http.post(
            f"{admin}/console/signin",
            data={"csrf": csrf, "token": OWNER},
            allow_redirects=False,
            headers={**held, "Origin": admin},
        )
        assert own.status == 403  # the listener's own address is not where browsers reach it here
        proxied = await http.post(
            f"{admin}/console/signin",
            data={"csrf": csrf, "token": OWNER},
            allow_redirects=False,
            headers={**held, "Origin": "https://gateway-admin.example"},
        )
        assert proxied.status == 303
        cookie = proxied.headers["Set-Cookie"]
        assert "modelgate_console=" in cookie and "Secure" in cookie and "HttpOnly" in cookie


async def test_an_owner_makes_an_admin_token_in_the_console_and_its_holder_signs_in_with_its_role(gateway) -> None:
    http, csrf = await signed_in(gateway.admin)
    async with http:
        answer = await http.post(
            f"{gateway.admin}/console/admin-tokens",
            data={"csrf": csrf, "name": "oncall", "role": "viewer", "tenant": "", "expires_at": ""},
            headers={"Origin": gateway.admin},
        )
        page = await answer.text()
        assert answer.status == 200 and "only time the token is shown" in page
        secret = re.search(r'<code id="secret">([^<]+)</code>', page)[1]
    viewer, viewer_csrf = await signed_in(gateway.admin, secret)
    async with viewer:
        keys = await (await viewer.get(f"{gateway.admin}/console/keys")).text()
        assert "oncall · viewer" in keys and "/console/admin-tokens" not in keys  # no Admins tab but an owner's
        refused = await viewer.get(f"{gateway.admin}/console/admin-tokens")
        assert refused.status == 403
        refused = await viewer.post(
            f"{gateway.admin}/console/keys",
            data={"csrf": viewer_csrf, "name": "nope"},
            headers={"Origin": gateway.admin},
        )
        assert refused.status == 403  # a viewer reads, and changes nothing
    http, csrf = await signed_in(gateway.admin)
    async with http:
        deleted = await http.post(
            f"{gateway.admin}/console/admin-tokens/oncall/delete",
            data={"csrf": csrf},
            headers={"Origin": gateway.admin},
        )
        assert deleted.status == 200 and deleted.url.path == "/console/admin-tokens"
    assert [t["name"] for t in (await api(gateway.admin, "GET", "/admin-tokens"))[1]["admin_tokens"]] == []
