"""What the benchmarks share about the processes they start: ports, readiness, memory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from proxy.config import ADMIN_LISTEN_ENV


def no_admin_listeners() -> None:
    """The benchmarks run gateways side by side and scrape none of them: no admin listener, so they
    do not meet on its default port. An environment variable rather than a config key or a flag,
    since a baseline checked out from before the admin listener ignores it (and would refuse
    either). Set by a benchmark's main, never on import: a test importing these helpers must not
    turn off the admin listener of every gateway the test session starts."""
    os.environ.setdefault(ADMIN_LISTEN_ENV, "")


def cpu_model() -> str:
    """The processor's name, as the benchmarks' reports give the machine."""
    import platform

    return next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM to every process at once, then each waited on for `timeout_s`: one that is still
    running is killed, and said so (waiting on them one by one, a process that never stopped
    aborted the loop and left the others running)."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(
                f"process {proc.pid} ({' '.join(map(str, proc.args[-3:]))}) did not stop within {timeout_s:g} s of "
                "SIGTERM: killed",
                file=sys.stderr,
                flush=True,
            )
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants: a supervisor and its workers together."""
    return rss_kb(pid) + sum(tree_rss_kb(child) for child in children(pid))


class CpuQuota:
    """A process held to `share` of one core by the kernel's CPU controller (a cgroup of its own),
    so a benchmark can overload it with load generated on the other core. The quota is handed out
    every `period_us` (4 ms: the process waits at most that long minus its share for its next
    slice). Works with cgroup v1 (`cpu.cfs_quota_us`) and v2 (`cpu.max`); raises OSError where
    neither may be written (not root, or no CPU controller)."""

    def __init__(self, pid: int, share: float, period_us: int = 4000) -> None:
        v1 = Path("/sys/fs/cgroup/cpu")
        self.v2 = not (v1 / "cpu.cfs_quota_us").exists()
        self.group = (Path("/sys/fs/cgroup") if self.v2 else v1) / f"modelgate-bench-{pid}"
        self.group.mkdir(exist_ok=True)
        quota = max(1000, int(share * period_us))
        if self.v2:
            (self.group / "cpu.max").write_text(f"{quota} {period_us}")
        else:
            (self.group / "cpu.cfs_period_us").write_text(str(period_us))
            (self.group / "cpu.cfs_quota_us").write_text(str(quota))
        (self.group / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Once the process has exited (a group holding a process cannot be removed)."""
        try:
            self.group.rmdir()
        except OSError:
            pass
