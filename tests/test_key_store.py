"""Keys, tenants and admin tokens managed at run time: made with the CLI against one instance,
seen by every instance within a second, checked against the caller's role, every attempt in the
audit trail; unknown keys never reach the database."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests.conftest import MESSAGE_HEADERS, POSTGRES
from tests.polling import within

OWNER = "owner-token-0123456789abcdef"
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
# The promise is a second (modelgate_key_store_propagation_seconds shows tens of milliseconds);
# the tests allow three, for a CI host running three test processes each with gateways of their own.
PROPAGATION_S = 3.0


def config(redis_url: str, database_url: str, prefix: str, key_store: str = "", more: str = "") -> str:
    """Gateways sharing Redis and a key store; `key_store`: more of that section (`, oidc: {...}`);
    `more`: more sections, at the top level."""
    return f"""
        server: {{listen: '127.0.0.1:{{PORT}}', admin_listen: '127.0.0.1:{{ADMIN_PORT}}', admin_token: {OWNER}}}
        state: {{backend: redis, url: "{redis_url}", prefix: "{prefix}:"}}
        key_store: {{database_url: "{database_url}", resync_s: 3600{key_store}}}
        observability: {{logging: {{access_log: false}}}}
        {more}
    """


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )


async def status(http: aiohttp.ClientSession, url: str, secret: str) -> int:
    async with http.post(
        url + "/v1/messages", json=MESSAGE, headers={**MESSAGE_HEADERS, "x-api-key": secret}
    ) as answer:
        await answer.read()
        return answer.status


@pytest.fixture
def three(spawn, redis_url: str, ledger_db: str, tmp_path: Path):
    return [spawn("gateway", config=config(redis_url, ledger_db, tmp_path.name)) for _ in range(3)]


async def test_a_key_made_on_one_instance_serves_on_all_three_within_a_second_and_is_revoked_as_fast(three) -> None:
    a, b, c = three
    made = cli(
        "keys", "create", "ci", "--models", "msgmodel-*", "--rpm", "600", "--admin-url", a.admin, "--admin-token", OWNER
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]  # the secret alone on the last line
    shown = json.loads(made.stdout.rsplit("\n", 2)[0])
    assert shown["name"] == "ci" and shown["source"] == "store" and secret not in json.dumps(shown)
    async with aiohttp.ClientSession() as http:
        for gateway in (a, b, c):
            assert await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, secret, 200)) <= PROPAGATION_S
        async with http.post(
            b.url + "/v1/messages",
            json={**MESSAGE, "model": "genmodel-2.0-flash"},
            headers={**MESSAGE_HEADERS, "x-api-key": secret},
        ) as answer:
            assert answer.status == 403  # the stored key's models hold as a configured key's do

        disabled = cli("keys", "disable", "ci", "--admin-url", b.admin, "--admin-token", OWNER)
        assert disabled.returncode == 0, disabled.stderr
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, secret, 401))
        held = await _keys_held(http, c.admin)
        assert held["stored", "disabled"] == 1 and held["stored", "active"] == 0, held
        assert held["config", "active"] == 1 and held["config", "disabled"] == 0, held  # the config's demo key

        assert cli("keys", "enable", "ci", "--admin-url", c.admin, "--admin-token", OWNER).returncode == 0
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, secret, 200))

        rotated = cli("keys", "rotate", "ci", "--grace-s", "8", "--admin-url", a.admin, "--admin-token", OWNER)
        assert rotated.returncode == 0, rotated.stderr
        fresh = rotated.stdout.strip().splitlines()[-1]
        grace_ends = datetime.fromisoformat(json.loads(rotated.stdout.rsplit("\n", 2)[0])["previous_valid_until"])
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, fresh, 200))
            assert await status(http, gateway.url, secret) == 200  # the old secret, within its grace
        await asyncio.sleep(max(0.0, (grace_ends - datetime.now(timezone.utc)).total_seconds() + 0.2))
        for gateway in (a, b, c):
            assert await status(http, gateway.url, secret) == 401  # and not after it
            assert await status(http, gateway.url, fresh) == 200

        assert cli("keys", "delete", "ci", "--admin-url", a.admin, "--admin-token", OWNER).returncode == 0
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, fresh, 401))


async def _keys_held(http: aiohttp.ClientSession, admin_url: str) -> dict[tuple[str, str], float]:
    """`modelgate_keys` as an instance's admin listener shows it, by (source, state)."""
    async with http.get(admin_url + "/metrics") as answer:
        text = await answer.text()
    return {
        (source, state): float(value)
        for source, state, value in re.findall(r'^modelgate_keys\{source="(\w+)",state="(\w+)"\} (\S+)$', text, re.M)
    }


async def _synced_twice(http: aiohttp.ClientSession, admin_url: str) -> bool:
    """The read at start and the sync loop's first, both done (`modelgate_key_store_syncs`)."""
    async with http.get(admin_url + "/metrics") as answer:
        found = re.search(r'^modelgate_key_store_syncs_total\{outcome="ok"\} (\S+)$', await answer.text(), re.M)
    return found is not None and float(found.group(1)) >= 2


async def _is(http: aiohttp.ClientSession, url: str, secret: str, wanted: int) -> bool:
    return await status(http, url, secret) == wanted


async def test_a_tenant_admin_sees_and_changes_its_tenant_s_keys_only_and_every_attempt_is_audited(three) -> None:
    a, b, _ = three
    owner = ("--admin-url", a.admin, "--admin-token", OWNER)
    for tenant in ("acme", "globex"):
        assert cli("tenants", "create", tenant, *owner).returncode == 0
    assert cli("keys", "create", "globex-batch", "--tenant", "globex", *owner).returncode == 0
    made = cli("admin-token", "create", "acme-ops", "--role", "tenant-admin", "--tenant", "acme", *owner)
    assert made.returncode == 0, made.stderr
    acme = ("--admin-url", b.admin, "--admin-token", made.stdout.strip().splitlines()[-1])

    own = cli("keys", "create", "acme-web", *acme)  # its tenant, without naming it
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout.rsplit("\n", 2)[0])["tenant"] == "acme"
    listed = json.loads(cli("keys", "list", *acme).stdout)
    assert [key["name"] for key in listed["keys"]] == ["acme-web"]  # not globex's, nor the config's
    for attempt in (
        ("keys", "show", "globex-batch"),
        ("keys", "disable", "globex-batch"),
        ("keys", "create", "sneaky", "--tenant", "globex"),
        ("tenants", "delete", "globex"),
        ("admin-token", "create", "me-too", "--role", "owner"),
    ):
        refused = cli(*attempt, *acme)
        assert refused.returncode == 1 and "403 forbidden" in refused.stderr, (attempt, refused.stderr)
    assert cli("keys", "list", "--tenant", "globex", *acme).returncode == 1

    trail = json.loads(cli("audit", "--limit", "50", *owner).stdout)["entries"]
    denied = [(e["action"], e["target"]) for e in trail if e["outcome"] == "denied"]
    assert sorted(denied) == [
        ("admin_token.create", "me-too"),
        ("key.create", "sneaky"),
        ("key.disable", "globex-batch"),
        ("key.list", None),
        ("key.read", "globex-batch"),
        ("tenant.delete", "globex"),
    ]
    assert all(
        e["actor"] == "token:acme-ops" and e["role"] == "tenant-admin" for e in trail if e["outcome"] == "denied"
    )
    made_by_acme = next(e for e in trail if e["action"] == "key.create" and e["target"] == "acme-web")
    assert made_by_acme["actor"] == "token:acme-ops" and made_by_acme["after"]["tenant"] == "acme"
    assert not any("mg-" in json.dumps(e) for e in trail)  # no secret, ever
    # The tenant-admin's own trail is its tenant's only.
    seen = json.loads(cli("audit", *acme).stdout)["entries"]
    assert seen and all(e["tenant"] == "acme" for e in seen)


async def test_the_admin_api_asks_every_caller_who_it_is_and_says_what_is_wrong_with_a_field(three) -> None:
    a = three[0]
    async with aiohttp.ClientSession() as http:
        async with http.get(a.admin + "/admin/v1/keys") as answer:  # the admin listener, no token
            assert answer.status == 401 and (await answer.json())["error"]["code"] == "admin_credential_required"
        async with http.get(a.admin + "/admin/v1/keys", headers={"Authorization": "Bearer nope"}) as answer:
            assert answer.status == 401
        async with http.get(a.url + "/admin/v1/keys") as answer:  # the clients' listener: server.admin_token only
            assert answer.status == 401 and (await answer.json())["error"]["code"] == "admin_token_required"
        owner = {"Authorization": f"Bearer {OWNER}"}
        for body, field in (
            ({"name": "x", "limits": {"rpm": 0}}, "limits.rpm"),
            ({"name": "x", "models": []}, "models"),
            ({"name": "x", "budget": {"tokens_per_dy": 5}}, "budget.tokens_per_dy"),
            ({"name": "x", "key": "my-own-secret"}, "key"),
            ({"name": "bad name"}, "name"),
            ({"name": "demo"}, "name"),  # the config file's key
            ({"name": "x", "tenant": "nobody"}, "tenant"),
        ):
            async with http.post(a.admin + "/admin/v1/keys", json=body, headers=owner) as answer:
                error = (await answer.json())["error"]
                assert answer.status in (400, 409) and error["field"] == field, (body, error)
        async with http.post(a.admin + "/admin/v1/keys", data=b"{not json", headers=owner) as answer:
            assert answer.status == 400
        async with http.patch(a.admin + "/admin/v1/keys/demo", json={"enabled": False}, headers=owner) as answer:
            assert answer.status == 409 and (await answer.json())["error"]["code"] == "configured_key"
        again = {**owner, "Idempotency-Key": "create-ci-1"}
        async with http.post(a.admin + "/admin/v1/keys", json={"name": "ci"}, headers=again) as first:
            assert first.status == 201 and (await first.json())["secret"].startswith("mg-")
        async with http.post(a.admin + "/admin/v1/keys", json={"name": "ci"}, headers=again) as retried:
            body = await retried.json()
            assert retried.status == 200 and body["replayed"] and body["secret"] is None
        async with http.get(a.admin + "/admin/v1/keys", headers=owner) as answer:
            sources = {key["name"]: key["source"] for key in (await answer.json())["keys"]}
            assert sources == {"ci": "store", "demo": "config"}


async def test_random_keys_never_reach_the_database(spawn, redis_url: str, ledger_db: str, tmp_path: Path) -> None:
    """10,000 requests with random keys: not one statement in the key store's database. Read off
    pg_stat_activity, which is live: a session's last change of state, and no new session."""
    gateway = spawn("gateway", config=config(redis_url, ledger_db, tmp_path.name))
    database = ledger_db.rsplit("/", 1)[1]
    stats = await asyncpg.connect(POSTGRES)  # a session in another database

    async def sessions() -> dict[int, object]:
        rows = await stats.fetch("SELECT pid, state_change FROM pg_stat_activity WHERE datname = $1", database)
        return {row["pid"]: row["state_change"] for row in rows}

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            await within(5, lambda: _is(http, gateway.url, "mg-warm-up", 401))
            # The key store's first read after start (it opens its LISTEN session, then reads) may
            # still be under way when the listener answers: the baseline is taken after it.
            await within(5, lambda: _synced_twice(http, gateway.admin))
            before = await sessions()
            assert before  # the gateway's listening session, at least

            async def burst(offset: int) -> list[int]:
                return [await status(http, gateway.url, f"mg-random-{offset}-{n}") for n in range(200)]

            found = await asyncio.gather(*(burst(i) for i in range(50)))
        assert {code for codes in found for code in codes} == {401}
        assert await sessions() == before
    finally:
        await stats.close()


class LonePostgres:
    """A PostgreSQL server of the test's own (initdb into a temporary directory), which it may stop
    and start again without touching the one the other tests share."""

    def __init__(self, root: Path, port: int) -> None:
        self.data, self.port, self.root = root / "data", port, root
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", "pg_ctl", "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        self._ctl(
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1",
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")


@pytest.fixture
def lone_postgres():
    import shutil
    import tempfile

    from bench.procs import free_port

    # Not under pytest's own temporary directory: the server runs as `postgres`, which may not enter it.
    root = Path(tempfile.mkdtemp(prefix="modelgate-postgres-"))
    shutil.chown(root, "postgres")
    root.chmod(0o700)
    subprocess.run(
        ["runuser", "-u", "postgres", "--", "initdb", "-D", str(root / "data"), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    server = LonePostgres(root, free_port())
    server.start()
    yield server
    subprocess.run(
        ["runuser", "-u", "postgres", "--", "pg_ctl", "-D", str(server.data), "-m", "immediate", "stop"],
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(root, ignore_errors=True)


async def test_with_postgresql_stopped_keys_held_keep_working_and_a_change_after_it_is_back_reaches_all(
    spawn, redis_url: str, lone_postgres: LonePostgres, tmp_path: Path
) -> None:
    a, b = (spawn("gateway", config=config(redis_url, lone_postgres.url, tmp_path.name)) for _ in range(2))
    owner = ("--admin-url", a.admin, "--admin-token", OWNER)
    made = cli("keys", "create", "held", *owner)
    assert made.returncode == 0, made.stderr
    held = made.stdout.strip().splitlines()[-1]
    async with aiohttp.ClientSession() as http:
        for gateway in (a, b):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, held, 200))
        lone_postgres.stop()
        for gateway in (a, b):
            assert await status(http, gateway.url, held) == 200  # the keys held keep working
        refused = cli("keys", "create", "later", *owner)
        assert refused.returncode == 2 and "503 key_store_unavailable" in refused.stderr
        async with http.get(a.admin + "/readyz") as answer:
            assert answer.status == 200  # a shared store away pulls no instance out of its balancer
        lone_postgres.start()
        made = cli("keys", "create", "later", *owner)
        assert made.returncode == 0, made.stderr
        later = made.stdout.strip().splitlines()[-1]
        for gateway in (a, b):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, later, 200))


async def test_a_stored_key_s_limits_and_budget_hold_as_a_configured_key_s_do(three) -> None:
    """Stored with the same fields as a `keys[]` entry, read by the same plugins: a rate limit and
    a token budget named only in the key store hold (on another instance than the one that made them)."""
    a, b, _ = three
    owner = ("--admin-url", a.admin, "--admin-token", OWNER)
    limited = cli("keys", "create", "slow", "--rpm", "2", *owner)
    budgeted = cli("keys", "create", "thrifty", "--set", 'budget={"tokens_per_day": 40}', *owner)
    assert limited.returncode == budgeted.returncode == 0, limited.stderr + budgeted.stderr
    slow, thrifty = (made.stdout.strip().splitlines()[-1] for made in (limited, budgeted))
    async with aiohttp.ClientSession() as http:
        await within(PROPAGATION_S, lambda: _is(http, b.url, slow, 200))
        assert await status(http, b.url, slow) == 200
        assert await status(http, b.url, slow) == 429
        # A request may spend 33 tokens (its max_tokens and input): one fits the day's 40, a second does not.
        await within(PROPAGATION_S, lambda: _is(http, b.url, thrifty, 200), "thrifty")
        async with http.post(
            b.url + "/v1/messages", json=MESSAGE, headers={**MESSAGE_HEADERS, "x-api-key": thrifty}
        ) as answer:
            assert answer.status == 429 and (await answer.json())["error"]["code"] == "budget_exceeded"


async def test_a_key_s_and_a_tenant_s_spend_and_budgets_are_read_where_their_admins_may(
    spawn, redis_url: str, ledger_db: str, tmp_path: Path
) -> None:
    """`keys usage` and `tenants usage`: what the ledger recorded today and this month, and each
    budget window's limit, spend and remainder, the two agreeing; a tenant-admin reads its own
    tenant's and no other's; the key store alone (-c) cannot answer it."""
    more = (
        f"plugins: {{ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.1}}, "
        "budget: {tenants: {acme: {tokens_per_month: 100000}}}}"
    )
    a, b = (spawn("gateway", config=config(redis_url, ledger_db, tmp_path.name, more=more)) for _ in range(2))
    owner = ("--admin-url", a.admin, "--admin-token", OWNER)
    for tenant in ("acme", "globex"):
        assert cli("tenants", "create", tenant, *owner).returncode == 0
    made = cli("keys", "create", "acme-web", "--tenant", "acme", "--set", 'budget={"tokens_per_day": 5000}', *owner)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    other = cli("keys", "create", "globex-batch", "--tenant", "globex", *owner)
    async with aiohttp.ClientSession() as http:
        await within(PROPAGATION_S, lambda: _is(http, b.url, secret, 200))
        for _ in range(3):
            assert await status(http, b.url, secret) == 200
        globex_secret = other.stdout.strip().splitlines()[-1]
        await within(PROPAGATION_S, lambda: _is(http, a.url, globex_secret, 200))  # another tenant's spend

        async def recorded() -> bool:
            shown = json.loads(cli("keys", "usage", "acme-web", *owner).stdout)
            return shown["reports"]["ledger"]["today"]["requests"] == 4

        await within(10, recorded, "the ledger's rows")

    key = json.loads(cli("keys", "usage", "acme-web", *owner).stdout)
    assert key["name"] == "acme-web" and key["tenant"] == "acme"
    today = key["reports"]["ledger"]["today"]
    spent = today["input_tokens"] + today["output_tokens"]
    assert spent > 0 and key["reports"]["ledger"]["this_month"]["requests"] == 4
    windows = {w["name"]: w for w in key["reports"]["budget"]["windows"]}
    assert set(windows) == {"key-day-tokens", "tenant-month-tokens"}
    assert windows["key-day-tokens"]["spent"] == spent and windows["key-day-tokens"]["limit"] == 5000
    assert windows["key-day-tokens"]["remaining"] == 5000 - spent
    assert windows["tenant-month-tokens"]["spent"] == spent  # the tenant's one key

    tenant = json.loads(cli("tenants", "usage", "acme", *owner).stdout)
    assert tenant["reports"]["ledger"]["today"]["input_tokens"] == today["input_tokens"]
    assert [w["name"] for w in tenant["reports"]["budget"]["windows"]] == ["tenant-month-tokens"]

    token = cli("admin-token", "create", "acme-ops", "--role", "tenant-admin", "--tenant", "acme", *owner)
    acme = ("--admin-url", b.admin, "--admin-token", token.stdout.strip().splitlines()[-1])
    assert json.loads(cli("tenants", "usage", "acme", *acme).stdout)["reports"]["budget"] == tenant["reports"]["budget"]
    for attempt in (("keys", "usage", "globex-batch"), ("tenants", "usage", "globex")):
        refused = cli(*attempt, *acme)
        assert refused.returncode == 1 and "403 forbidden" in refused.stderr, (attempt, refused.stderr)
    denied = [
        e["action"]
        for e in json.loads(cli("audit", "--actor", "token:acme-ops", *owner).stdout)["entries"]
        if e["outcome"] == "denied"
    ]
    assert sorted(denied) == ["key.usage", "tenant.usage"]

    bootstrap = tmp_path / "bootstrap.yaml"
    bootstrap.write_text(f"key_store: {{database_url: '{ledger_db}'}}\n")
    direct = cli("keys", "usage", "acme-web", "-c", str(bootstrap))
    assert direct.returncode == 1 and "needs_a_gateway" in direct.stderr, direct.stderr


async def test_a_stored_tenant_s_limits_and_budget_hold_for_all_its_keys_together(three) -> None:
    """A tenant made with `--rpm 3` and a token budget: its two keys share them, on another
    instance than the one that made them; raising the limit reaches every instance, as a key's
    change does; a tenant-admin may read its tenant's settings and not change them."""
    a, b, c = three
    owner = ("--admin-url", a.admin, "--admin-token", OWNER)
    made = cli("tenants", "create", "acme", "--rpm", "3", *owner)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["limits"] == {"rpm": 3}
    thrifty = cli("tenants", "create", "globex", "--set", 'budget={"tokens_per_day": 40}', *owner)
    assert thrifty.returncode == 0, thrifty.stderr
    secrets = [
        cli("keys", "create", name, "--tenant", tenant, *owner).stdout.strip().splitlines()[-1]
        for name, tenant in (("acme-web", "acme"), ("acme-batch", "acme"), ("globex-web", "globex"))
    ]
    async with aiohttp.ClientSession() as http:
        await within(PROPAGATION_S, lambda: _is(http, b.url, secrets[1], 200), "acme-batch")  # 1 of acme's 3
        assert await status(http, b.url, secrets[0]) == 200
        assert await status(http, c.url, secrets[1]) == 200
        async with http.post(
            b.url + "/v1/messages", json=MESSAGE, headers={**MESSAGE_HEADERS, "x-api-key": secrets[0]}
        ) as answer:
            assert answer.status == 429, await answer.text()
            assert '"tenant-rpm"' in answer.headers["RateLimit-Policy"]

        # A request may spend 33 tokens: one fits globex's day of 40, a second does not, whichever key.
        await within(PROPAGATION_S, lambda: _is(http, c.url, secrets[2], 200), "globex-web")
        async with http.post(
            c.url + "/v1/messages", json=MESSAGE, headers={**MESSAGE_HEADERS, "x-api-key": secrets[2]}
        ) as answer:
            assert answer.status == 429 and (await answer.json())["error"]["code"] == "budget_exceeded"
        windows = json.loads(cli("tenants", "usage", "globex", *owner).stdout)["reports"]["budget"]["windows"]
        assert [(w["name"], w["limit"]) for w in windows] == [("tenant-day-tokens", 40)]

        raised = cli("tenants", "update", "acme", "--rpm", "100", *owner)
        assert raised.returncode == 0, raised.stderr
        assert json.loads(raised.stdout)["limits"] == {"rpm": 100}
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, secrets[0], 200), "the raised limit")

    bad = cli("tenants", "update", "acme", "--set", 'budget={"tokens_per_dy": 5}', *owner)
    assert bad.returncode == 1 and "budget.tokens_per_dy" in bad.stderr, bad.stderr
    token = cli("admin-token", "create", "acme-ops", "--role", "tenant-admin", "--tenant", "acme", *owner)
    acme = ("--admin-url", c.admin, "--admin-token", token.stdout.strip().splitlines()[-1])
    assert json.loads(cli("tenants", "show", "acme", *acme).stdout)["limits"] == {"rpm": 100}
    refused = cli("tenants", "update", "acme", "--rpm", "100000", *acme)
    assert refused.returncode == 1 and "403 forbidden" in refused.stderr, refused.stderr


@pytest.mark.parametrize("revoked_streams", ["end", "finish"])
async def test_a_stream_open_under_a_key_disabled_meanwhile_ends_or_finishes_as_configured(
    spawn, redis_url: str, ledger_db: str, tmp_path: Path, revoked_streams: str
) -> None:
    slow = "channels: [{name: simulator, base_url: simulator, simulator: {chunk_delay_ms: 150, output_tokens: 30}}]"
    gateway = spawn(
        "gateway",
        config=config(redis_url, ledger_db, tmp_path.name, f", revoked_streams: {revoked_streams}", more=slow),
    )
    owner = ("--admin-url", gateway.admin, "--admin-token", OWNER)
    secret = cli("keys", "create", "streamer", *owner).stdout.strip().splitlines()[-1]
    async with aiohttp.ClientSession() as http:
        await within(PROPAGATION_S, lambda: _is(http, gateway.url, secret, 200))
        async with http.post(
            gateway.url + "/v1/messages",
            json={**MESSAGE, "max_tokens": 64, "stream": True},
            headers={**MESSAGE_HEADERS, "x-api-key": secret},
        ) as answer:
            assert answer.status == 200
            first = await answer.content.readuntil(b"\n\n")
            assert b"message_start" in first
            assert cli("keys", "disable", "streamer", *owner).returncode == 0
            disabled = time.monotonic()  # made: the CLI's own start (seconds, on a busy machine) is not the gateway's
            rest = await answer.content.read()
            took = time.monotonic() - disabled
    if revoked_streams == "end":
        assert b"api_key_revoked" in rest and b"message_stop" not in rest, rest[-300:]
        assert took < PROPAGATION_S, took  # the whole stream takes 4.5 s
    else:
        assert b"message_stop" in rest and b"api_key_revoked" not in rest, rest[-300:]


async def test_changes_made_at_once_on_two_instances_all_reach_every_instance(three) -> None:
    """Thirty keys disabled at the same moment through two instances: each change commits in the
    order its revision was taken, so no instance reads past one and serves a revoked key on."""
    a, b, c = three
    owner = {"Authorization": f"Bearer {OWNER}"}
    async with aiohttp.ClientSession() as http:
        secrets = []
        for n in range(30):
            async with http.post(a.admin + "/admin/v1/keys", json={"name": f"k{n}"}, headers=owner) as answer:
                secrets.append((await answer.json())["secret"])
        for gateway in (a, b, c):
            await within(PROPAGATION_S, lambda g=gateway: _is(http, g.url, secrets[-1], 200))

        async def disable(n: int) -> int:
            admin = (a, b)[n % 2].admin
            async with http.post(f"{admin}/admin/v1/keys/k{n}/disable", headers=owner) as answer:
                return answer.status

        assert set(await asyncio.gather(*(disable(n) for n in range(30)))) == {200}
        for gateway in (a, b, c):
            for secret in secrets:
                await within(PROPAGATION_S, lambda g=gateway, s=secret: _is(http, g.url, s, 401))


async def test_what_a_hostile_admin_sends_is_refused_as_a_4xx_without_leaking_a_thing(three) -> None:
    a = three[0]
    owner_cli = ("--admin-url", a.admin, "--admin-token", OWNER)
    for tenant in ("acme", "globex"):
        assert cli("tenants", "create", tenant, *owner_cli).returncode == 0
    tokens = {}
    for tenant in ("acme", "globex"):
        made = cli("admin-token", "create", f"{tenant}-ops", "--role", "tenant-admin", "--tenant", tenant, *owner_cli)
        tokens[tenant] = {"Authorization": "Bearer " + made.stdout.strip().splitlines()[-1]}
    owner = {"Authorization": f"Bearer {OWNER}"}
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str, headers: dict, body: object = None) -> tuple[int, dict]:
            async with http.request(method, a.admin + "/admin/v1" + path, json=body, headers=headers) as answer:
                return answer.status, await answer.json()

        # An Idempotency-Key is the caller's own: another's finds nothing of it, and a replay must be the same create.
        made = await call("POST", "/keys", {**tokens["acme"], "Idempotency-Key": "deploy-1"}, {"name": "acme-web"})
        assert made[0] == 201
        stolen = await call("POST", "/keys", {**tokens["globex"], "Idempotency-Key": "deploy-1"}, {"name": "gx"})
        assert stolen[0] == 201 and stolen[1]["name"] == "gx" and stolen[1]["tenant"] == "globex"
        reused = await call("POST", "/keys", {**tokens["acme"], "Idempotency-Key": "deploy-1"}, {"name": "other"})
        assert reused[0] == 409 and "acme-web" not in json.dumps(reused[1])
        assert (await call("POST", "/keys", {**owner, "Idempotency-Key": "x" * 300}, {"name": "y"}))[0] == 400
        # Values PostgreSQL cannot hold, and names no record can have: 4xx, never the store's 503.
        for method, path, body in (
            ("POST", "/keys", {"name": "nul", "labels": {"x": "\u0000"}}),
            ("GET", "/keys/acme-web%00", None),
            ("DELETE", "/tenants/acme%00", None),
            ("GET", "/audit?before=99999999999999999999999", None),
            ("GET", "/audit?actor=%00", None),
            ("POST", "/admin-tokens", {"name": "t", "role": "viewer", "expires_at": "9999-12-31T23:59:59-14:00"}),
            ("POST", "/admin-tokens", {"name": "t", "role": "viewer", "expires_at": "2000-01-01T00:00:00Z"}),
        ):
            answer = await call(method, path, owner, body)
            assert 400 <= answer[0] < 500, (method, path, answer)
        # The config file's keys are no tenant's: a tenant-admin learns nothing of them.
        assert (await call("GET", "/keys/demo", tokens["acme"]))[0] == 404
        assert (await call("GET", "/keys/demo", owner))[1]["source"] == "config"
        assert (await call("GET", "/audit?tenant=globex", tokens["acme"]))[0] == 403
        # Denied attempts are the trail of the tenant that made them, not of the one they aimed at.
        assert (await call("DELETE", "/tenants/globex", tokens["acme"]))[0] == 403
        globex_trail = (await call("GET", "/audit", tokens["globex"]))[1]["entries"]
        assert not any(e["actor"] == "token:acme-ops" for e in globex_trail)
        # A change to limits changes what it names and keeps the rest.
        await call("POST", "/keys", owner, {"name": "both", "limits": {"rpm": 5, "tpm": 200000}})
        changed = await call("PATCH", "/keys/both", owner, {"limits": {"rpm": 1000}})
        assert changed[1]["limits"] == {"rpm": 1000, "tpm": 200000}
        # A deleted tenant's admins go with it: its name taken again later is not theirs.
        assert (await call("DELETE", "/keys/gx", owner))[0] == 200
        assert (await call("DELETE", "/tenants/globex", owner))[0] == 200
        assert (await call("POST", "/tenants", owner, {"name": "globex"}))[0] == 201
        assert (await call("GET", "/keys", tokens["globex"]))[0] == 401


class Issuer:
    """An OIDC issuer of the test's own: its key set served over HTTP, and tokens it signs."""

    def __init__(self) -> None:
        from joserfc.jwk import RSAKey

        self.key = RSAKey.generate_key(2048, private=True, parameters={"kid": "current"})
        self.url = ""

    def jwks(self) -> dict:
        return {"keys": [self.key.as_dict(private=False)]}

    def token(self, key=None, **claims) -> str:
        from joserfc import jwt

        key = key or self.key
        body = {
            "iss": "https://issuer.test",
            "aud": "modelgate-admin",
            "sub": "alice",
            "exp": int(time.time()) + 300,
            "modelgate_role": "operator",
            **claims,
        }
        return jwt.encode({"alg": "RS256", "kid": key.kid}, {k: v for k, v in body.items() if v is not None}, key)


@pytest.fixture
async def issuer():
    from aiohttp import web

    from bench.procs import free_port

    found = Issuer()
    app = web.Application()
    app.router.add_get("/jwks", lambda _: web.json_response(found.jwks()))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    found.url = f"http://127.0.0.1:{port}/jwks"
    yield found
    await runner.cleanup()


async def test_an_oidc_token_from_the_configured_issuer_names_its_caller_and_nothing_else_passes(
    spawn, redis_url: str, ledger_db: str, tmp_path: Path, issuer: Issuer
) -> None:
    from joserfc.jwk import RSAKey

    oidc = (
        f', oidc: {{issuer: "https://issuer.test", audience: modelgate-admin, jwks_url: "{issuer.url}", '
        "jwks_cache_s: 1}"
    )
    gateway = spawn("gateway", config=config(redis_url, ledger_db, tmp_path.name, oidc))

    async def call(token: str, method: str = "GET", path: str = "/keys", body: dict | None = None) -> tuple[int, dict]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, gateway.admin + "/admin/v1" + path, json=body, headers={"Authorization": f"Bearer {token}"}
            ) as answer,
        ):
            return answer.status, await answer.json()

    assert (await call(issuer.token()))[0] == 200
    status_, made = await call(issuer.token(sub="bob"), "POST", "/keys", {"name": "via-sso"})
    assert status_ == 201 and made["created_by"] == "oidc:bob"
    assert (await call(issuer.token(modelgate_role="viewer"), "POST", "/keys", {"name": "no"}))[0] == 403
    rogue = RSAKey.generate_key(2048, private=True, parameters={"kid": "current"})
    stranger = RSAKey.generate_key(2048, private=True, parameters={"kid": "elsewhere"})
    import base64

    unsigned = (
        ".".join(
            base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()
            for part in (
                {"alg": "none"},
                {
                    "iss": "https://issuer.test",
                    "aud": "modelgate-admin",
                    "sub": "eve",
                    "exp": int(time.time()) + 300,
                    "modelgate_role": "owner",
                },
            )
        )
        + "."
    )
    for why, token in (
        ("expired", issuer.token(exp=int(time.time()) - 120)),
        ("another audience", issuer.token(aud="someone-else")),
        ("another issuer", issuer.token(iss="https://evil.test")),
        ("unsigned", unsigned),
        ("signed by another key under the issuer's kid", issuer.token(key=rogue)),
        ("signed by a key the issuer does not publish", issuer.token(key=stranger)),
        ("no role", issuer.token(modelgate_role=None)),
        ("an unknown role", issuer.token(modelgate_role="root")),
        ("a tenant-admin without a tenant", issuer.token(modelgate_role="tenant-admin")),
    ):
        status_, body = await call(token)
        assert status_ == 401 and body["error"]["code"] == "invalid_admin_credential", (why, status_, body)
    # The issuer rotates its key: a token under the new kid is accepted once the set is fetched
    # again (kept a second here, jwks_cache_s).
    issuer.key = RSAKey.generate_key(2048, private=True, parameters={"kid": "next"})
    await asyncio.sleep(1.1)
    assert (await call(issuer.token()))[0] == 200
    trail = (await call(issuer.token(), path="/audit"))[1]["entries"]
    assert any(e["actor"] == "oidc:bob" and e["action"] == "key.create" for e in trail)


async def test_a_notice_that_arrives_while_the_keys_are_being_read_is_not_lost() -> None:
    """A change notified while the previous one is still being read is read next, at once, not a
    resync later (the notice used to be cleared with the read it arrived during)."""
    from proxy.keystore.directory import KeySync, StoredKeys

    class Store:
        url, timeout_s = "postgresql://unused@127.0.0.1/none", 1.0

        def __init__(self) -> None:
            self.reads = 0
            self.release = asyncio.Event()

        async def keys_since(self, revision: int) -> list:
            self.reads += 1
            if self.reads == 2:  # the read a notice woke: another notice arrives while it runs
                sync._wake.set()
                await self.release.wait()
            return []

        async def revisions(self) -> tuple[int, dict]:
            return 0, {}

    store = Store()
    sync = KeySync(store, StoredKeys(), resync_s=3600)  # type: ignore[arg-type]

    async def listening() -> None:
        return None

    sync._listen = listening  # type: ignore[method-assign]  # no PostgreSQL here: the notices are the test's
    await sync.start()
    try:
        await asyncio.sleep(0.05)
        reads = store.reads
        sync._wake.set()
        await asyncio.sleep(0.05)
        store.release.set()
        for _ in range(100):
            if store.reads > reads + 1:
                break
            await asyncio.sleep(0.01)
        assert store.reads > reads + 1
    finally:
        await sync.stop()


def test_check_config_says_where_the_keys_come_from_without_the_store_s_password(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("key_store: {database_url: 'postgresql://gw:s3cret-pw@db.example:5433/modelgate'}\n")
    checked = cli("check-config", str(config_file))
    assert checked.returncode == 0, checked.stderr
    assert (
        "keys: 1 from this file; more managed at run time in the key store (db.example:5433/modelgate" in checked.stdout
    )
    assert "s3cret" not in checked.stdout + checked.stderr


async def test_an_admin_body_sent_in_pieces_is_read_whole(three) -> None:
    """A body that arrives in several reads (a slow client, a large one) is the whole body, not its first piece."""
    a = three[0]
    host, port = a.admin.removeprefix("http://").split(":")
    body = json.dumps({"name": "pieces", "labels": {"note": "x" * 20_000}}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /admin/v1/keys HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {OWNER}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body[:100]
    )
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.write(body[100:])
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]


async def test_keys_made_live_by_the_thousand_are_moved_out_of_the_collectors_reach() -> None:
    """Ten thousand keys made live after start made each full pass of the garbage collector 15-50 ms,
    every request stalled that long: past FREEZE_AFTER keys made live, what is held is frozen, as
    what start-up built is. A few keys changed now and then are not worth it."""
    import gc
    import os
    from datetime import datetime, timezone

    from proxy.keystore.directory import FREEZE_AFTER, KeySync, StoredKeys
    from proxy.keystore.records import StoredKey

    now = datetime.now(timezone.utc)
    made = iter(range(1, 10**6))

    def rows(count: int) -> list[StoredKey]:
        return [
            StoredKey(f"k{n}", os.urandom(32), None, None, None, {}, n, now, "t", now, "t")
            for n in (next(made) for _ in range(count))
        ]

    class Store:
        url, timeout_s = "postgresql://unused@127.0.0.1/none", 1.0
        pending: list[StoredKey] = []

        async def keys_since(self, revision: int) -> list[StoredKey]:
            taken, self.pending = self.pending, []
            return taken

        async def tenant_specs(self) -> dict:
            return {}

    store = Store()
    sync = KeySync(store, StoredKeys(), resync_s=3600)  # type: ignore[arg-type]
    frozen = gc.get_freeze_count()
    try:
        store.pending = rows(10)
        await sync.refresh()
        assert gc.get_freeze_count() == frozen  # a few keys: left to the collector
        store.pending = many = rows(FREEZE_AFTER)
        await sync.refresh()
        assert gc.get_freeze_count() > frozen + FREEZE_AFTER  # the keys, and what holds them
        assert sync.keys.find_digest(many[-1].sha256) is not None  # and served as ever
    finally:
        gc.unfreeze()  # the test process's heap back to the collector
