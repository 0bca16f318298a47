"""The supervisor: N worker processes sharing one listening port, for every core.

Each worker is a whole gateway on its own event loop, bound to the port with SO_REUSEPORT so
the kernel spreads connections among them. The supervisor only watches: it passes SIGTERM
(drain) and SIGHUP (reload) on, starts a worker again when one dies, and gives the workers a
shared directory for prometheus-client's multiprocess mode, so any worker's /metrics shows
the sum of all of them. It also watches the config file and the secret files it names
(proxy/process/watch.py): a change is a SIGHUP of its own, so every worker reloads at once.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from proxy.observability.metrics import WORKER_ENV
from proxy.process.watch import FileWatch

log = logging.getLogger("modelgate.workers")

SUPERVISOR_ENV = "MODELGATE_SUPERVISOR_PID"
RELOAD_ENV = "MODELGATE_RELOAD_FROM"  # the config file a worker reloads (it starts from the last good copy)
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_CRASH_LOOP = 5  # workers dying this soon after starting, this many times in a row: give up
_CRASH_WINDOW_S = 2.0
# A worker's exit status when its listeners were bound to the same socket address (sysexits'
# EX_CONFIG): every worker started again would bind them the same way, so the supervisor stops.
LISTENERS_OVERLAP = 78


def is_worker() -> bool:
    return os.environ.get(WORKER_ENV) is not None


def bind_to_supervisor() -> None:
    """A worker dies with its supervisor, even one killed with SIGKILL: the kernel kills it too
    when the parent goes (a supervisor that dies that way drains nothing; its workers, left
    listening, would take a new gateway's connections). A supervisor already gone before that was
    asked for is caught by comparing the parent's pid; the worker then exits at once."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent check below is all there is
        log.warning("no parent-death signal on this system: workers outlive a killed supervisor")
    expected = os.environ.get(SUPERVISOR_ENV)
    if expected is not None and os.getppid() != int(expected):
        log.error("the supervisor that started this worker is gone; exiting")
        raise SystemExit(1)


def _ignore_hangups() -> None:
    """In a worker being started: a SIGHUP before its loop handles them would kill it (the
    default action). It starts from the config the supervisor kept, so missing one loses nothing."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port already, on any address the host names (as the
    server binds each of them): a bind without SO_REUSEPORT fails where any socket holds the
    address, workers of another gateway included, which would otherwise share it."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # the server will say why it cannot bind
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no listener
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds it
            try:
                probe.bind(address)
            except OSError:
                return True
    return False


class Supervisor:
    """Starts the workers, restarts the ones that die, and stops them all on SIGTERM."""

    def __init__(
        self,
        count: int,
        config_path: str | Path | None,
        drain_timeout_s: float,
        files: Mapping[str, str | None] | None = None,
        watch_s: float = 0.0,
        settle_s: float = 0.0,
    ) -> None:
        self.count = count
        self.config_path = config_path
        self.drain_timeout_s = drain_timeout_s
        self.metrics_dir = tempfile.mkdtemp(prefix="modelgate-metrics-")
        # The last config the workers accepted: a worker started again (after a crash) starts from
        # it, not from a file edited since, which might be broken or differ from what the others run.
        self.good_config: Path | None = None
        if config_path is not None:
            # Inside the directory mkdtemp made for this process alone (0700): the copy holds keys and URLs.
            self.good_config = Path(self.metrics_dir) / "config.yaml"
            self.good_config.write_text(Path(config_path).read_text(encoding="utf-8"), encoding="utf-8")
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.quick_deaths = 0
        # What the config read when loaded (LoadedConfig.files), and how often to look again.
        self.watch = FileWatch(files or {})
        self.watch_s = watch_s
        self.settle_s = settle_s
        self._hangup = False  # a SIGHUP not yet passed on: the watch loop does it, never two at once

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hung_up)
        try:
            for slot in range(self.count):
                self._start(slot)
            log.info(
                "modelgate supervising workers",
                extra={"workers": self.count, "pids": [p.pid for p in self.workers.values()]},
            )
            return self._watch()
        finally:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _start(self, slot: int) -> None:
        command = [sys.executable, "-m", "proxy", "serve"]
        env = {
            **os.environ,
            WORKER_ENV: str(slot),
            SUPERVISOR_ENV: str(os.getpid()),
            "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
        }
        if self.config_path is not None:
            command += ["-c", str(self.good_config)]
            env[RELOAD_ENV] = str(self.config_path)
        process = subprocess.Popen(command, env=env, preexec_fn=_ignore_hangups)
        self.workers[slot] = process
        if self.stopping:  # a SIGTERM handled while Popen ran passed this worker by: it was not listed yet
            process.send_signal(signal.SIGTERM)

    def _watch(self) -> int:
        started = {slot: time.monotonic() for slot in self.workers}
        next_look = time.monotonic() + self.watch_s
        while not self.stopping:
            time.sleep(0.2)
            if self._hangup:
                self._hangup = False
                self._reload()
            elif self.watch_s and self.config_path is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + self.watch_s
                if changed := self.watch.changed(self.settle_s):
                    log.info("config files changed; reloading every worker", extra={"files": changed})
                    self._reload()
            for slot, process in list(self.workers.items()):
                if self.stopping or process.poll() is None:
                    continue
                self._mark_dead(process.pid)
                if process.returncode == LISTENERS_OVERLAP:
                    log.error(
                        "a worker found server.admin_listen bound where server.listen is; stopping",
                        extra={"pid": process.pid},
                    )
                    self._stop()
                    self._wait_all()
                    return 1
                quick = time.monotonic() - started[slot] < _CRASH_WINDOW_S
                self.quick_deaths = self.quick_deaths + 1 if quick else 0
                if self.quick_deaths >= _CRASH_LOOP:
                    log.error("workers keep dying at start; giving up", extra={"exit_code": process.returncode})
                    self._stop()
                    self._wait_all()
                    return 1
                log.error("worker died; starting another", extra={"pid": process.pid, "exit_code": process.returncode})
                self._start(slot)
                started[slot] = time.monotonic()
        return self._wait_all()

    def _wait_all(self) -> int:
        deadline = time.monotonic() + self.drain_timeout_s + 5
        worst = 0
        for process in self.workers.values():
            try:
                worst = max(worst, process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                process.kill()
                worst = max(worst, process.wait())
            self._mark_dead(process.pid)
        return worst

    def _stop(self, *_: object) -> None:
        self.stopping = True
        for process in self.workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def _hung_up(self, *_: object) -> None:
        self._hangup = True

    def _reload(self) -> None:
        """Pass SIGHUP on (each worker reloads the file, and counts the outcome); a file that is
        valid becomes what a worker started from now on starts from."""
        if self.config_path is not None and self.good_config is not None:
            from proxy.config import ConfigError, refuse_empty_reload
            from proxy.config.files import UnreadableFile, digest, read_file
            from proxy.registry import config_from_text

            path = str(self.config_path)
            data = b""
            try:
                data = read_file(path)
                refuse_empty_reload(path, data)  # the workers refuse it too
                text = data.decode("utf-8")
                loaded = config_from_text(text, path, os.environ, {path: digest(data)})
            except (UnreadableFile, UnicodeDecodeError):
                # refused by the workers too, who say why; new workers keep the last good one
                self.watch.loaded({path: digest(data) if data else None})
            except ConfigError as exc:
                self.watch.loaded(exc.files)
            else:
                self.watch.loaded(loaded.files)
                self.watch_s = loaded.config.server.watch_config_s
                self.settle_s = loaded.config.server.watch_settle_s
                staged = self.good_config.with_suffix(".new")
                staged.write_text(text, encoding="utf-8")
                staged.replace(self.good_config)
        for process in self.workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGHUP)

    def _mark_dead(self, pid: int) -> None:
        from prometheus_client import multiprocess

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        multiprocess.mark_process_dead(pid, self.metrics_dir)
