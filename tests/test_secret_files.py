"""Secrets from files, and reloads without a signal: `${file:/path}` is read at every load, and
the gateway watches its config file and each file it names, reloading by itself when one
changes, on every worker. Files are updated here the way the kubelet updates a mounted Secret:
a new directory, then the `..data` symlink swapped to it."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigError, text_digest
from proxy.config.files import digest
from proxy.process.watch import FileWatch
from proxy.registry import config_from_text, load_config, parse_config
from tests.conftest import REDIS_URL
from tests.test_config import check_config
from tests.test_ledger import ledger_config, rows_when
from tests.test_workers import children

UPSTREAM_SECRET = "upstream-s3cret-one"


class MountedSecret:
    """A folder laid out as the kubelet lays out a Secret or ConfigMap volume: each name a symlink
    into `..data`, itself a symlink to the current timestamped folder, swapped atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir(parents=True, exist_ok=True)

    def write(self, files: dict[str, str]) -> None:
        self.versions += 1
        version = self.root / f"..2025_01_01_00_00_{self.versions:02d}.{os.getpid()}"
        version.mkdir()
        for name, text in files.items():
            (version / name).write_text(text)
        swap = self.root / "..data_tmp"
        swap.symlink_to(version.name)
        swap.replace(self.root / "..data")  # rename(2): the one atomic step
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        for old in self.root.glob("..2025_*"):
            if old != version:
                for child in old.iterdir():
                    child.unlink()
                old.rmdir()

    def path(self, name: str) -> str:
        return str(self.root / name)


# --- ${file:} ---------------------------------------------------------------------------------


def test_a_file_reference_is_the_files_text_without_its_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "credential").write_text("upstream-one\n")
    (tmp_path / "key").write_text("gateway-key-0001\r\n")
    (tmp_path / "url").write_text("redis://127.0.0.1:6379/9")
    loaded = config_from_text(
        textwrap.dedent(f"""
        state: {{url: "${{file:{tmp_path}/url}}"}}
        keys: [{{name: k, key: "${{file:{tmp_path}/key}}"}}]
        channels:
          - {{name: a, base_url: simulator, credential: "${{file:{tmp_path}/credential}}"}}
          - {{name: b, base_url: simulator, credential: "Bearer-$${{file:/not/read}}"}}
    """),
        "<test>",
        {},
    )
    config = loaded.config
    assert config.channels[0].credential == "upstream-one"
    assert config.keys[0].key == "gateway-key-0001"
    assert config.state.url == "redis://127.0.0.1:6379/9"
    assert config.channels[1].credential == "Bearer-${file:/not/read}"  # $${ is a literal ${, nothing read
    assert sorted(loaded.files) == sorted(f"{tmp_path}/{name}" for name in ("credential", "key", "url"))


def test_a_file_that_cannot_be_used_is_a_problem_naming_its_path_never_its_content(tmp_path: Path) -> None:
    (tmp_path / "two-lines").write_text(f"{UPSTREAM_SECRET}\nsecond line\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + UPSTREAM_SECRET.encode())
    os.mkfifo(tmp_path / "fifo")  # opened without blocking: a FIFO named by mistake hangs nothing
    text = textwrap.dedent(f"""
        channels:
          - {{name: a, base_url: simulator, credential: "${{file:{tmp_path}/missing}}"}}
          - {{name: b, base_url: simulator, credential: "${{file:secrets/relative}}"}}
          - {{name: c, base_url: simulator, credential: "${{file:{tmp_path}/two-lines}}"}}
          - {{name: d, base_url: simulator, credential: "${{file:{tmp_path}/binary}}"}}
          - {{name: e, base_url: simulator, credential: "${{file:{tmp_path}/fifo}}"}}
          - {{name: f, base_url: simulator, credential: "${{file:{tmp_path}}}"}}
    """)
    with pytest.raises(ConfigError) as refused:
        config_from_text(text, "<test>", {})
    problems = refused.value.problems
    assert f"channels[0].credential: cannot read {tmp_path}/missing: no such file" in problems
    assert "channels[1].credential: ${file:secrets/relative} must name an absolute path" in problems
    assert "channels[2].credential: holds a line break or another control character" in problems
    assert f"channels[3].credential: {tmp_path}/binary is not UTF-8 text" in problems
    assert f"channels[4].credential: cannot read {tmp_path}/fifo: not a regular file" in problems
    assert f"channels[5].credential: cannot read {tmp_path}: not a regular file" in problems
    assert not any(UPSTREAM_SECRET in problem or "second line" in problem for problem in problems)
    assert refused.value.files[f"{tmp_path}/missing"] is None  # watched: it may be mounted in a moment


def test_an_empty_file_is_refused_whatever_value_it_is_for(tmp_path: Path) -> None:
    """A file rewritten in place is empty between its truncation and its write: read then, it must
    not become a channel credential of "" (sent as none), nor any other value."""
    (tmp_path / "empty").write_text("")
    (tmp_path / "newline").write_text("\n")
    with pytest.raises(ConfigError) as refused:
        config_from_text(
            textwrap.dedent(f"""
            server: {{public_base_url: "https://gw.example.com${{file:{tmp_path}/empty}}"}}
            keys: [{{name: k, key: "${{file:{tmp_path}/newline}}"}}]
            channels: [{{name: a, base_url: simulator, credential: "${{file:{tmp_path}/empty}}"}}]
        """),
            "<test>",
            {},
        )
    problems = refused.value.problems
    assert f"server.public_base_url: {tmp_path}/empty is empty" in problems
    assert f"keys[0].key: {tmp_path}/newline is empty" in problems
    assert f"channels[0].credential: {tmp_path}/empty is empty" in problems
    assert refused.value.files[f"{tmp_path}/empty"] == digest(b"")  # watched: its content comes next


def test_a_placeholder_left_in_a_file_a_variable_or_the_config_is_refused_naming_where(tmp_path: Path) -> None:
    (tmp_path / "credential").write_text("CHANGE-ME\n")
    text = textwrap.dedent(f"""
        server: {{public_base_url: "https://CHANGE-ME.example.com"}}
        keys: [{{name: k, key: "${{GATEWAY_KEY}}"}}, {{name: j, key: "${{OTHER:-CHANGE-ME-0001}}"}}]
        channels: [{{name: a, base_url: simulator, credential: "${{file:{tmp_path}/credential}}"}}]
    """)
    with pytest.raises(ConfigError) as refused:
        config_from_text(text, "<test>", {"GATEWAY_KEY": "prefix-CHANGE-ME-suffix"})
    assert refused.value.problems == [
        "server.public_base_url: the placeholder CHANGE-ME is still in the config file: replace it with the real value",
        "keys[0].key: the placeholder CHANGE-ME is still in the variable GATEWAY_KEY: replace it with the real value",
        "keys[1].key: the placeholder CHANGE-ME is still in the default of OTHER: replace it with the real value",
        f"channels[0].credential: the placeholder CHANGE-ME is still in the file {tmp_path}/credential: "
        "replace it with the real value",
    ]


def test_check_config_and_serve_refuse_a_placeholder_and_say_which_file(tmp_path: Path) -> None:
    (tmp_path / "credential").write_text("CHANGE-ME\n")
    config = tmp_path / "gateway.yaml"
    config.write_text(f'channels: [{{name: a, base_url: simulator, credential: "${{file:{tmp_path}/credential}}"}}]\n')
    checked = check_config(config)
    assert checked.returncode == 1
    assert (
        f"channels[0].credential: the placeholder CHANGE-ME is still in the file {tmp_path}/credential"
        in checked.stderr
    )
    served = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config), "--listen", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )
    assert served.returncode == 1 and f"still in the file {tmp_path}/credential" in served.stderr


# --- the watch --------------------------------------------------------------------------------


def test_the_watch_sees_a_symlink_swap_a_same_size_rewrite_a_removal_and_a_return(tmp_path: Path) -> None:
    mount = MountedSecret(tmp_path / "secrets")
    mount.write({"credential": "one"})
    plain = tmp_path / "config.yaml"
    plain.write_text("server: {max_headers: 50}\n")
    loaded = load_config(plain)
    watch = FileWatch(loaded.files)
    watch.loaded({mount.path("credential"): digest(b"one")})  # as a load that read it records it
    assert watch.changed() == []
    mount.write({"credential": "two"})  # same size, a new inode behind the same path
    assert watch.changed() == [mount.path("credential")]
    assert watch.changed() == []  # seen now
    before = plain.stat()
    plain.write_text("server: {max_headers: 60}\n")  # same size, and the same mtime: times cannot tell
    os.utime(plain, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert watch.changed() == [str(plain)]
    plain.unlink()
    assert watch.changed() == [str(plain)]
    plain.write_text("server: {max_headers: 60}\n")
    assert watch.changed() == [str(plain)]


def test_a_change_is_taken_once_it_has_read_the_same_for_the_settle(tmp_path: Path, clock) -> None:
    """A file being written differs at each look until it is whole: nothing is taken until two looks
    `settle_s` apart read the same."""
    config = tmp_path / "config.yaml"
    config.write_text("server: {max_headers: 50}\n")
    watch = FileWatch(load_config(config).files, clock=clock)
    config.write_text("server: {max_head")  # half of it
    assert watch.changed(2.0) == []  # seen, not yet taken
    clock.advance(1.0)
    config.write_text("server: {max_headers: 60}\n")  # the rest: read otherwise, the settle starts again
    assert watch.changed(2.0) == []
    clock.advance(1.5)
    assert watch.changed(2.0) == []
    clock.advance(0.5)
    assert watch.changed(2.0) == [str(config)]
    assert watch.changed(2.0) == []  # seen now
    config.write_text("server: {max_headers: 50}\n")
    clock.advance(5.0)
    assert watch.changed(2.0) == []  # however long since the last look: one look is no settle
    config.write_text("server: {max_headers: 60}\n")  # and back before it settled: nothing changed
    clock.advance(5.0)
    assert watch.changed(2.0) == []
    clock.advance(5.0)
    assert watch.changed(2.0) == []


# --- through the gateway, with no signal ---------------------------------------------------------


def serving_worker(connection: http.client.HTTPConnection, workers: list[int]) -> int:
    """The worker process holding the server side of a kept-alive client connection, read from
    /proc: the socket whose ends are this connection's, and the process that has it open."""
    assert connection.sock is not None
    client_port = connection.sock.getsockname()[1]
    server_port = connection.sock.getpeername()[1]
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local == server_port and remote == client_port:
                inodes.add(f"socket:[{fields[9]}]")
    for pid in workers:
        for descriptor in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(descriptor) in inodes:
                    return pid
            except OSError:
                continue
    raise AssertionError("no worker holds this connection")


def one_connection_per_worker(url: str, workers: list[int]) -> dict[int, http.client.HTTPConnection]:
    """Kept-alive connections until every worker has one (the kernel spreads new connections)."""
    host, port = url.removeprefix("http://").split(":")
    held: dict[int, http.client.HTTPConnection] = {}
    for _ in range(64):
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        worker = serving_worker(connection, workers)
        if worker in held:
            connection.close()
        else:
            held[worker] = connection
        if len(held) == len(workers):
            return held
    raise AssertionError(f"64 connections reached only {sorted(held)} of {workers}")


def ask(connection: http.client.HTTPConnection, key: str, request_id: str) -> int:
    connection.request(
        "POST",
        "/v1/responses",
        body=json.dumps({"model": "respmodel-4o", "input": "hi"}),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", "X-Request-Id": request_id},
    )
    answer = connection.getresponse()
    answer.read()
    return answer.status


def upstream_saw(simulator_url: str, request_id: str) -> str | None:
    """The Authorization the upstream received with a request id, if it received one."""
    with urllib.request.urlopen(simulator_url + "/_sim/requests", timeout=10) as answer:
        seen: list[dict[str, Any]] = json.loads(answer.read())
    for request in seen:
        headers = {name.lower(): value for name, value in request["headers"]}
        if headers.get("x-request-id") == request_id:
            return headers.get("authorization")
    return None


def credential_sent(gateway_url: str, simulator_url: str, prefix: str) -> Callable[[], str | None]:
    """A call that sends one request through the gateway (on one kept connection) and says which
    credential the upstream saw with it."""
    connection = http.client.HTTPConnection(gateway_url.removeprefix("http://"), timeout=10)
    sent = iter(range(1000))

    def credential_upstream() -> str | None:
        request_id = f"{prefix}-{next(sent)}"
        assert ask(connection, "gateway-key-0001", request_id) == 200
        return upstream_saw(simulator_url, request_id)

    return credential_upstream


def until(condition: Any, within_s: float) -> bool:
    """Poll `condition` until it holds, for `within_s` at most (a bound, not a measurement)."""
    deadline = time.monotonic() + within_s
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


GATEWAY = """
server: {{listen: "127.0.0.1:{{PORT}}", workers: 2}}
state: {{backend: redis, url: '{redis}', prefix: 'secret-files-{unique}:'}}
keys:
  - {{name: first, key: "${{file:{secrets}/gateway-key}}"}}
{more_keys}
channels: [{{name: upstream, base_url: "{upstream}", credential: "${{file:{secrets}/upstream-credential}}"}}]
observability: {{logging: {{access_log: false}}}}
"""


async def test_a_rotated_secret_and_an_edited_config_reach_every_worker_within_5_s_without_a_signal(
    spawn, redis_url, tmp_path: Path
) -> None:
    secrets = MountedSecret(tmp_path / "secrets")
    secrets.write({"gateway-key": "gateway-key-0001\n", "upstream-credential": f"{UPSTREAM_SECRET}\n"})
    simulator = spawn("simulator")
    fields = {
        "redis": REDIS_URL,
        "unique": f"{os.getpid()}-{time.monotonic_ns()}",
        "secrets": secrets.root,
        "upstream": simulator.url,
    }
    gateway = spawn("gateway", config=GATEWAY.format(**fields, more_keys=""))
    config = next(tmp_path.glob("gateway-*.yaml"))
    workers = children(gateway.proc.pid)
    assert len(workers) == 2
    connections = one_connection_per_worker(gateway.url, workers)
    for worker, connection in connections.items():
        assert ask(connection, "gateway-key-0001", f"before-{worker}") == 200
        assert upstream_saw(simulator.url, f"before-{worker}") == f"Bearer {UPSTREAM_SECRET}"
        assert ask(connection, "gateway-key-0002", f"unknown-{worker}") == 401

    secrets.write({"gateway-key": "gateway-key-0001\n", "upstream-credential": "upstream-s3cret-two\n"})
    rotated = set()

    def every_worker_sends_the_new_credential() -> bool:
        for worker, connection in connections.items():
            if worker not in rotated:
                request_id = f"after-{worker}-{time.monotonic_ns()}"
                assert ask(connection, "gateway-key-0001", request_id) == 200
                if upstream_saw(simulator.url, request_id) == "Bearer upstream-s3cret-two":
                    rotated.add(worker)
        return rotated == set(workers)

    assert until(every_worker_sends_the_new_credential, within_s=5.0), f"rotated on {rotated} of {workers}"

    config.write_text(
        GATEWAY.replace("{{PORT}}", gateway.url.rsplit(":", 1)[1]).format(
            **fields, more_keys='  - {name: second, key: "gateway-key-0002"}'
        )
    )  # edited in place, as an editor does
    accepted = set()

    def every_worker_knows_the_new_key() -> bool:
        for worker, connection in connections.items():
            if worker not in accepted and ask(connection, "gateway-key-0002", f"new-key-{worker}") == 200:
                accepted.add(worker)
        return accepted == set(workers)

    assert until(every_worker_knows_the_new_key, within_s=5.0), f"new key on {accepted} of {workers}"
    assert sorted(children(gateway.proc.pid)) == sorted(workers)  # reloaded, not restarted
    for connection in connections.values():
        connection.close()


SINGLE = """
server: {{listen: "127.0.0.1:{{PORT}}"}}
keys: [{{name: first, key: gateway-key-0001}}]
channels: [{{name: upstream, base_url: "{upstream}", credential: "${{file:{secrets}/upstream-credential}}"}}]
"""


async def test_one_process_reloads_by_itself_and_keeps_the_last_good_config_when_a_secret_goes(
    spawn, tmp_path: Path
) -> None:
    secrets = MountedSecret(tmp_path / "secrets")
    secrets.write({"upstream-credential": f"{UPSTREAM_SECRET}\n"})
    simulator = spawn("simulator")
    gateway = spawn("gateway", config=SINGLE.format(upstream=simulator.url, secrets=secrets.root))
    credential_upstream = credential_sent(gateway.url, simulator.url, "single")

    assert credential_upstream() == f"Bearer {UPSTREAM_SECRET}"
    secrets.write({"upstream-credential": "upstream-s3cret-two\n"})
    assert until(lambda: credential_upstream() == "Bearer upstream-s3cret-two", within_s=5.0)

    (secrets.root / "upstream-credential").unlink()  # gone: refused, the running config stays
    assert until(lambda: "config reload refused" in gateway.log.read_text(), within_s=5.0)
    assert credential_upstream() == "Bearer upstream-s3cret-two"
    refused = next(json.loads(line) for line in gateway.log.read_text().splitlines() if "config reload refused" in line)
    assert refused["problems"] == [
        f"channels[0].credential: cannot read {secrets.root}/upstream-credential: no such file"
    ]
    assert "s3cret" not in gateway.log.read_text()  # no secret in any log line

    secrets.write({"upstream-credential": "upstream-s3cret-three\n"})  # back: taken at once
    assert until(lambda: credential_upstream() == "Bearer upstream-s3cret-three", within_s=5.0)
    assert gateway.proc.poll() is None


def test_watching_can_be_turned_off(tmp_path: Path) -> None:
    assert parse_config("server: {watch_config_s: 0}", {}).server.watch_config_s == 0
    with pytest.raises(ConfigError) as refused:
        parse_config("server: {watch_config_s: -1}", {})
    assert refused.value.problems[0].startswith("server.watch_config_s:")


# --- what a reload does with a rotated database URL ----------------------------------------------


async def test_a_rotated_database_url_is_taken_by_the_ledger_on_reload(
    ledger_db, start_gateway, http, tmp_path: Path
) -> None:
    """The URL the ledger had stops working (a password rotated away): records wait in the spool;
    the file gets the new URL, a reload, and the same writer writes them all with it."""
    mount = MountedSecret(tmp_path / "secrets")
    wrong = ledger_db.rsplit("/", 1)[0] + "/mg_ledger_no_such_database"
    mount.write({"database-url": wrong + "\n"})
    gateway = await start_gateway(ledger_config(f"${{file:{mount.path('database-url')}}}", str(tmp_path / "spool")))
    body = {"model": "respmodel-4o", "input": "hello"}
    for _ in range(3):
        async with http.post(
            gateway.url + "/v1/responses", headers={"Authorization": "Bearer sk-demo-key"}, json=body
        ) as answer:
            assert answer.status == 200
    mount.write({"database-url": ledger_db + "\n"})
    assert await gateway.owner.reload()
    async with http.post(
        gateway.url + "/v1/responses", headers={"Authorization": "Bearer sk-demo-key"}, json=body
    ) as answer:
        assert answer.status == 200
    assert len(await rows_when(ledger_db, 4)) == 4  # the three spooled, and the one after


# --- a file caught while it is written --------------------------------------------------------

EDITED = """
server: {{listen: "127.0.0.1:{{PORT}}", watch_config_s: 0.2, workers: {workers}}}
state: {{backend: {backend}, url: '{redis}', prefix: 'half-written-{unique}:'}}
observability: {{logging: {{access_log: false}}}}
keys:
  - {{name: first, key: gateway-key-0001}}
{added}  - name: fired
    key: gateway-key-fired
    enabled: false
"""


def status_for(url: str, key: str) -> int:
    """A fresh connection each time: with workers, the kernel spreads them over all of them."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        return ask(connection, key, f"probe-{time.monotonic_ns()}")
    finally:
        connection.close()


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_config_rewritten_in_place_is_not_loaded_half_written(
    spawn, redis_url, tmp_path: Path, workers: int
) -> None:
    """The file is written up to just before the last key's `enabled: false`, which is valid YAML
    enabling the key, and the rest follows several looks later: the key is never served, and the
    one reload is of the whole file (by the process itself, or by every worker its supervisor signals)."""
    fields = {
        "workers": workers,
        "backend": "redis" if workers > 1 else "memory",
        "redis": REDIS_URL,
        "unique": f"{os.getpid()}-{time.monotonic_ns()}",
    }
    gateway = spawn("gateway", config=EDITED.format(**fields, added=""))
    config = next(tmp_path.glob("gateway-*.yaml"))
    assert status_for(gateway.url, "gateway-key-0001") == 200
    assert status_for(gateway.url, "gateway-key-fired") == 401

    whole = config.read_text().replace("  - name: fired", "  - {name: added, key: gateway-key-0002}\n  - name: fired")
    cut = whole.index("    enabled: false")
    seen = []
    with config.open("r+") as file:  # rewritten in place, as an editor that truncates and writes does
        file.truncate()
        file.write(whole[:cut])
        file.flush()
        paused = time.monotonic()
        while time.monotonic() - paused < 0.8:  # four looks at 0.2 s, under the 2 s settle
            seen.append(status_for(gateway.url, "gateway-key-fired"))
            time.sleep(0.05)
        file.write(whole[cut:])
    assert set(seen) == {401}, seen
    assert until(lambda: status_for(gateway.url, "gateway-key-0002") == 200, within_s=15.0)
    for _ in range(2 * workers):
        assert status_for(gateway.url, "gateway-key-fired") == 401
    reloads = [json.loads(line) for line in gateway.log.read_text().splitlines() if '"config reloaded"' in line]
    assert [reload["digest"] for reload in reloads] == [text_digest(whole)] * workers

    # Left empty (truncated, the rest not written): valid YAML, the embedded defaults and their demo
    # key. A reload refuses it.
    config.write_text("")
    empty = f"<file>: {config} is empty: a reload keeps the running config"

    def refused_by_all() -> bool:
        lines = [json.loads(line) for line in gateway.log.read_text().splitlines() if "config reload refused" in line]
        return sum(any(p.startswith(empty) for p in line["problems"]) for line in lines) == workers

    assert until(refused_by_all, within_s=15.0)
    for _ in range(2 * workers):
        assert status_for(gateway.url, "sk-demo-key") == 401
        assert status_for(gateway.url, "gateway-key-0002") == 200


CREDENTIAL_FILE = """
server: {{listen: "127.0.0.1:{{PORT}}", watch_config_s: 0.2}}
keys: [{{name: first, key: gateway-key-0001}}]
channels: [{{name: upstream, base_url: "{upstream}", credential: "${{file:{credential}}}"}}]
"""


async def test_a_secret_file_caught_empty_keeps_the_running_credential(spawn, tmp_path: Path) -> None:
    """`echo new > file` truncates first: a file left empty (or read then) is refused, and requests
    keep the credential they had until the new one is written."""
    credential = tmp_path / "upstream-credential"
    credential.write_text(f"{UPSTREAM_SECRET}\n")
    simulator = spawn("simulator")
    gateway = spawn("gateway", config=CREDENTIAL_FILE.format(upstream=simulator.url, credential=credential))
    credential_upstream = credential_sent(gateway.url, simulator.url, "empty")

    assert credential_upstream() == f"Bearer {UPSTREAM_SECRET}"
    credential.write_text("")  # truncated, and the rest not written yet
    assert until(lambda: "config reload refused" in gateway.log.read_text(), within_s=15.0)
    refused = next(json.loads(line) for line in gateway.log.read_text().splitlines() if "config reload refused" in line)
    assert refused["problems"] == [f"channels[0].credential: {credential} is empty"]
    assert credential_upstream() == f"Bearer {UPSTREAM_SECRET}"

    credential.write_text("upstream-s3cret-two\n")
    assert until(lambda: credential_upstream() == "Bearer upstream-s3cret-two", within_s=15.0)
    assert "s3cret" not in gateway.log.read_text()
