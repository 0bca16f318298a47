"""Real Redis topologies for the tests: a three-primary Cluster and a Sentinel-managed primary.

Each runs as redis-server processes on free loopback ports, in a directory of its own, and is
torn down with the test session (or the test, for one a test breaks on purpose). The cluster's
slots are assigned here, in three even ranges, as an operator's `redis-cli --cluster create` would.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.conftest import free_port


def redis_server(port: int, directory: Path | str, *args: str) -> list[str]:
    """The command line of a throwaway Redis on 127.0.0.1:`port` (0: none; a TLS port may be in
    `args`), keeping nothing on disk beyond `directory`."""
    return [
        "redis-server",
        *args,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(directory),
    ]


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2.0, socket_connect_timeout=2.0)


def _command(port: int, *args: str) -> object:
    with _client(port) as client:
        return client.execute_command(*args)


def _wait(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, redis.RedisError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class RedisProcesses:
    directory: Path
    processes: dict[int, subprocess.Popen] = field(default_factory=dict)

    def start(self, port: int, *args: str) -> None:
        workdir = self.directory / str(port)
        workdir.mkdir(parents=True, exist_ok=True)
        log = (workdir / "redis.log").open("wb")
        self.processes[port] = subprocess.Popen(
            redis_server(port, workdir, *args),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _wait(lambda: _command(port, "PING"), f"redis on {port}")

    def kill(self, port: int) -> None:
        proc = self.processes.pop(port)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.processes.values():
            proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()


def _port_for_a_cluster_node() -> int:
    """A free port Redis takes for a cluster node: it refuses ports above 55535 (kept for the bus)."""
    while (port := free_port()) > 55535:
        pass
    return port


@dataclass
class Cluster:
    """Three primaries, no replicas; `url` is what state.url says."""

    ports: list[int]
    processes: RedisProcesses

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def flush(self) -> None:
        for port in self.ports:
            _command(port, "FLUSHALL")

    @classmethod
    def start(cls, directory: Path, full_coverage: bool = True) -> Cluster:
        """`full_coverage` False: the nodes left serve their slots while one is down."""
        processes = RedisProcesses(directory)
        ports = [_port_for_a_cluster_node() for _ in range(3)]
        buses = [free_port() for _ in ports]
        for port, bus in zip(ports, buses):
            processes.start(
                port,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                str(bus),
                "--cluster-require-full-coverage",
                "yes" if full_coverage else "no",
            )
        bounds = [0, 5461, 10923, 16384]
        for i, port in enumerate(ports):
            _command(port, "CLUSTER", "ADDSLOTSRANGE", str(bounds[i]), str(bounds[i + 1] - 1))
        for port, bus in zip(ports[1:], buses[1:]):
            _command(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port), str(bus))
        _wait(
            lambda: (
                all(_client(p).cluster("INFO")["cluster_state"] == "ok" for p in ports)
                and all(len(_client(p).cluster("NODES")) == 3 for p in ports)
            ),
            "the cluster to form",
        )
        return cls(ports, processes)


@dataclass
class SentinelSetup:
    """One primary, its replicas (one unless asked) and three sentinels (quorum two) watching it as `main`."""

    primary: int
    replicas: list[int]
    sentinels: list[int]
    processes: RedisProcesses
    name: str = "main"

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + f"/{self.name}/0"

    def current_primary(self) -> int:
        with _client(self.sentinels[0]) as sentinel:
            return int(sentinel.sentinel_get_master_addr_by_name(self.name)[1])

    def flush(self) -> None:
        _command(self.current_primary(), "FLUSHALL")

    def kill_primary(self) -> int:
        port = self.current_primary()
        self.processes.kill(port)
        return port

    @classmethod
    def start(cls, directory: Path, replicas: int = 1) -> SentinelSetup:
        processes = RedisProcesses(directory)
        primary, copies = free_port(), [free_port() for _ in range(replicas)]
        processes.start(primary)
        for replica in copies:
            processes.start(replica, "--replicaof", "127.0.0.1", str(primary))
            _wait(
                lambda replica=replica: _client(replica).info("replication")["master_link_status"] == "up",
                "the replica to sync",
            )
        sentinels = [free_port() for _ in range(3)]
        for port in sentinels:
            conf = directory / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor main 127.0.0.1 {primary} 2\n"
                "sentinel down-after-milliseconds main 1000\n"
                "sentinel failover-timeout main 5000\n"
                "sentinel parallel-syncs main 1\n"
            )
            log = (directory / f"sentinel-{port}.log").open("wb")
            processes.processes[port] = subprocess.Popen(
                ["redis-server", str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )
        for port in sentinels:
            _wait(
                lambda port=port: _client(port).sentinel_master("main")["num-other-sentinels"] >= 2,
                f"sentinel {port} to see the others",
            )
        return cls(primary, copies, sentinels, processes)
