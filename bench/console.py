"""The console's pages against a ledger of 1,000,000 rows: each page's answer time, through a
real gateway and PostgreSQL, signed in as the owner and as a tenant-admin.

The rows are written straight into the ledger's table once the gateway has made it (30 days,
50 tenants, 500 keys, 20 models, four routes, 2% 429s and 1% 5xx, costs and time splits), then
ANALYZEd, as a database that has been running a month would be. Each page is asked `--rounds`
times after one warm-up; the median and the slowest are reported against the target (300 ms).

Usage: .venv/bin/python bench/console.py [--rows N] [--rounds R] [--print-only]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.ledger import POSTGRES  # noqa: E402
from bench.procs import cpu_model, free_port, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402

OWNER = "bench-owner-token-0123456789"
TARGET_MS = 300.0
_FILL = """
INSERT INTO usage_records (request_id, at, client_request_id, key_name, tenant, route, model, upstream_model,
    channel, status, input_tokens, cached_input_tokens, output_tokens, reasoning_tokens, images, video_seconds,
    cost, priced, duration_ms, client_aborted, estimated, cut_by, pending, gateway_ms, upstream_ms, trace_id,
    attempts, error_code)
SELECT md5(i::text), now() - (i::double precision / $1) * interval '30 days',
    CASE WHEN i % 7 = 0 THEN 'client-' || i END,
    'key-' || (i * 7919 % 500), 'tenant:t' || (i * 7919 % 500 / 10),
    (ARRAY['responses', 'messages', 'generate_content', 'image_generations'])[1 + i % 4],
    'model-' || (i * 31 % 20), 'model-' || (i * 31 % 20), (ARRAY['primary', 'secondary', 'backup'])[1 + i % 3],
    CASE WHEN i % 100 = 0 THEN 502 WHEN i % 50 = 0 THEN 429 WHEN i % 97 = 0 THEN 400 ELSE 200 END,
    100 + i % 4000, i % 300, 10 + i % 900, i % 50, 0, 0,
    (100 + i % 4000) * 0.0000025 + (10 + i % 900) * 0.00001, true, 200 + i % 3000, i % 500 = 0, false,
    NULL, false, 1 + i % 9, 190 + i % 3000, md5(i::text || 't'), 1 + (i % 100 = 0)::int,
    CASE WHEN i % 100 = 0 THEN 'upstream_error' WHEN i % 50 = 0 THEN 'rate_limited' END
FROM generate_series(1::bigint, $1::bigint) AS i
"""


def config(port: int, admin_port: int, database_url: str, spool: str) -> str:
    return f"""
server: {{listen: '127.0.0.1:{port}', admin_listen: '127.0.0.1:{admin_port}', admin_token: {OWNER}}}
state: {{backend: memory}}
key_store: {{database_url: "{database_url}"}}
plugins: {{ledger: {{database_url: "{database_url}", spool_dir: "{spool}"}}}}
observability: {{logging: {{access_log: false}}}}
"""


async def fill(database_url: str, rows: int) -> float:
    import asyncpg

    from plugins.ledger.schema import migrate

    start = time.monotonic()
    connection = await asyncpg.connect(database_url)
    try:
        await migrate(connection)  # as the ledger's writer does before its first batch
        await connection.execute(_FILL, rows, timeout=3600)
        await connection.execute("ANALYZE usage_records", timeout=600)
    finally:
        await connection.close()
    return time.monotonic() - start


async def pages(admin: str, rounds: int) -> list[tuple[str, str, float, float]]:
    import aiohttp

    found: list[tuple[str, str, float, float]] = []
    async with aiohttp.ClientSession() as http:
        status, made = await _api(http, admin, "POST", "/tenants", {"name": "t7"})
        assert status in (201, 409), made
        status, token = await _api(
            http,
            admin,
            "POST",
            "/admin-tokens",
            {"name": f"t7-ops-{uuid.uuid4().hex[:6]}", "role": "tenant-admin", "tenant": "t7"},
        )
        assert status == 201, token
        status, listed = await _api(http, admin, "GET", "/requests?limit=1")
        some_id = listed["requests"][0]["request_id"]
        client_id = "client-700007"
        for who, credential in (("owner", OWNER), ("tenant-admin", token["secret"])):
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as browser:
                form = await (await browser.get(f"{admin}/console/signin")).text()
                csrf = re.search(r'name="csrf" value="([^"]+)"', form)[1]  # type: ignore[index]
                signed = await browser.post(
                    f"{admin}/console/signin", data={"csrf": csrf, "token": credential}, headers={"Origin": admin}
                )
                assert signed.status == 200 and signed.url.path == "/console/keys", signed.status
                paths = [
                    "/console/keys",
                    "/console/tenants",
                    "/console/spend",
                    "/console/spend?by=key&since=7d",
                    "/console/spend?by=model&since=1d",
                    "/console/requests",
                    "/console/requests?status=5xx",
                    "/console/requests?status=400",
                    "/console/requests?model=model-3",
                    "/console/requests?route=image_generations&since=1d",
                    "/console/requests?key=key-7&status=429",
                    f"/console/requests?request_id={client_id}",
                    "/console/audit",
                ]
                if who == "owner":
                    paths += [
                        "/console/spend?tenant=t7&by=key",
                        "/console/requests?tenant=t7",
                        f"/console/requests/{some_id}",
                        "/console/channels",
                        "/console/tenants/t7",
                    ]
                for path in paths:
                    times = []
                    for attempt in range(rounds + 1):
                        start = time.perf_counter()
                        async with browser.get(admin + path) as answer:
                            await answer.read()
                            assert answer.status in (200, 404), (path, answer.status)
                        if attempt:  # the first warms the pools and the database's caches
                            times.append((time.perf_counter() - start) * 1000)
                    found.append((who, path, statistics.median(times), max(times)))
    return found


async def _api(http, admin: str, method: str, path: str, body=None):
    async with http.request(
        method, f"{admin}/admin/v1{path}", json=body, headers={"Authorization": f"Bearer {OWNER}"}
    ) as answer:
        return answer.status, await answer.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args()
    import asyncpg

    name = f"mg_console_bench_{uuid.uuid4().hex[:8]}"
    database_url = POSTGRES.rsplit("/", 1)[0] + "/" + name

    async def database(sql: str) -> None:
        connection = await asyncpg.connect(POSTGRES)
        await connection.execute(sql)
        await connection.close()

    asyncio.run(database(f'CREATE DATABASE "{name}"'))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as work:
            port, admin_port = free_port(), free_port()
            cfg = Path(work) / "gateway.yaml"
            cfg.write_text(config(port, admin_port, database_url, str(Path(work) / "spool")))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "proxy", "serve", "-c", str(cfg)],
                    cwd=Path(__file__).parent.parent,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_port(admin_port)
            filled_s = asyncio.run(fill(database_url, args.rows))
            found = asyncio.run(pages(f"http://127.0.0.1:{admin_port}", args.rounds))
    finally:
        stop_all(procs, 10)
        asyncio.run(database(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    worst = max(slowest for *_, slowest in found)
    lines = [
        "## The console with a million ledger rows",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `.venv/bin/python bench/console.py --rows "
        f"{args.rows} --rounds {args.rounds}`. Machine: {cpu_model()}; PostgreSQL on the same machine, its "
        f"defaults. {args.rows:,} rows written straight into the ledger's table over 30 days (50 tenants, 500 "
        f"keys, 20 models, four routes, 2% 429s and 1% 5xx) in {filled_s:.0f} s, then ANALYZEd. Each page is "
        f"asked {args.rounds} times after a warm-up, through one gateway process, signed in (a session cookie, "
        "as a browser's); the time is the whole answer, read to its end.",
        "",
        "| signed in as | page | median ms | slowest ms |",
        "|---|---|---|---|",
        *(f"| {who} | `{path}` | {median:.1f} | {slowest:.1f} |" for who, path, median, slowest in found),
        "",
        f"Target: every page under {TARGET_MS:.0f} ms — {'met' if worst < TARGET_MS else 'NOT met'} "
        f"(slowest {worst:.1f} ms).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.print_only:
        update_section("console", text)


if __name__ == "__main__":
    main()
