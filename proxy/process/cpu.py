"""`WorkerCpu`: how much of the CPU one worker may use, and how much of it the worker is using.

What a worker may use is the least of one core (its event loop runs on one thread), the cores it
may run on (its affinity) shared among the workers, and the CPU quota of its control group (the
kernel's CPU controller: a container's CPU limit, a Kubernetes pod's `limits.cpu`) shared among
the workers. The quota is read again at most once a second, so a limit changed at run time (or a
process moved into a group after it started) is seen. What a worker uses is its event loop
thread's CPU time: the threads beside it (a log or trace exporter) do not serve requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

REREAD_S = 1.0


def quota_cores(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's control group in cores (cgroup v2 `cpu.max`, v1
    `cpu.cfs_quota_us` over `cpu.cfs_period_us`), or None when it has none or it cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        group = path.lstrip("/")
        try:
            if controllers == "":  # v2: one hierarchy, every controller
                quota, period = (root / group / "cpu.max").read_text().split()
                if quota != "max":
                    return int(quota) / int(period)
            elif "cpu" in controllers.split(","):
                base = root / controllers / group
                if not base.exists():
                    base = root / "cpu" / group  # mounted as cpu,cpuacct with a cpu link
                quota_us = int((base / "cpu.cfs_quota_us").read_text())
                if quota_us > 0:
                    return quota_us / int((base / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


class WorkerCpu:
    """The cores one of `workers` worker processes may use (`available`), and the CPU time its
    event loop's thread has used so far (`used`)."""

    __slots__ = ("workers", "used", "_quota", "_clock", "_cores", "_read_at")

    def __init__(
        self,
        workers: int = 1,
        quota: Callable[[], float | None] = quota_cores,
        used: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = max(1, workers)
        self.used = used
        self._quota = quota
        self._clock = clock
        self._cores = 1.0
        self._read_at = -REREAD_S

    def available(self) -> float:
        now = self._clock()
        if now - self._read_at >= REREAD_S:
            cores = (
                float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
            )
            quota = self._quota()
            if quota is not None:
                cores = min(cores, quota)
            self._cores = min(1.0, cores / self.workers)
            self._read_at = now
        return self._cores
