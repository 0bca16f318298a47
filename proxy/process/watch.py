"""Reloading by itself: the config file and every `${file:}` it names are read again every
`server.watch_config_s`, and a change reloads the config as SIGHUP does.

Content is compared, not times: Kubernetes updates a mounted ConfigMap or Secret by pointing its
`..data` symlink at a new directory, so the path stays the same while what it leads to changes,
and a file rewritten twice within one clock tick keeps its mtime and size. Reading is cheap here:
a config and a few secrets, once a second.

A change is taken once it has settled: the files read the same over `server.watch_settle_s`
(two reads at least), not as soon as they differ. A file rewritten in place (an editor that
truncates and writes, `cat > file`, a copy) is for a moment part of what it will be, and a part
that happens to be valid YAML would load: a key cut off before its `enabled: false` would be
served. The settle costs every change that much more before it reloads; a symlink swap or a
rename (a Kubernetes volume, an editor that writes a copy and moves it) is whole at once and waits
the same, harmlessly. A writer that pauses longer than the settle mid-file can still be read half
written: write elsewhere and rename. A signal reloads at once.

The supervisor of several workers watches, and passes a change on as the SIGHUP it already fans
out (proxy/process/workers.py); a single process watches for itself (`reload_on_change`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from proxy.config.files import file_digest

log = logging.getLogger("modelgate.watch")


class FileWatch:
    """What each watched file held when last loaded (a digest; None: it could not be read), and a
    change seen since, until it settles."""

    def __init__(self, files: Mapping[str, str | None], clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: dict[str, str | None] = dict(files)
        self._clock = clock
        self._pending: dict[str, str | None] = {}  # the files that differ, as they read at the last look
        self._pending_since = 0.0  # when they first read so

    @property
    def paths(self) -> list[str]:
        return list(self._seen)

    def loaded(self, *reads: Mapping[str, str | None]) -> None:
        """A load read these files as they were then: that is what later reads compare to. Files
        a config no longer names are kept: watching one too many costs a read, one too few a
        missed change."""
        for files in reads:
            self._seen.update(files)

    def changed(self, settle_s: float = 0.0) -> list[str]:
        """The files whose content differs from what was last loaded, once what they hold has read
        the same at every look for `settle_s` (0: at once); they are seen now. A file that reads
        otherwise than at the last look starts the settle again: it is still being written."""
        differing = {}
        for path, before in self._seen.items():
            now = file_digest(path)
            if now != before:
                differing[path] = now
        if differing != self._pending:
            self._pending, self._pending_since = differing, self._clock()
        if not differing or (settle_s and self._clock() - self._pending_since < settle_s):
            return []
        self._seen.update(differing)
        self._pending = {}
        return list(differing)


async def reload_on_change(
    watch: FileWatch,
    interval_s: Callable[[], float],
    settle_s: Callable[[], float],
    reload: Callable[[], Awaitable[Mapping[str, str | None]]],
) -> None:
    """Until cancelled: every `interval_s()` seconds (0: not now, look at the setting again in a
    second), reload when a watched file changed and settled over `settle_s()`. `reload` answers the
    files it read, whether the new config was taken or refused (a refused one keeps the last good
    config running)."""
    while True:
        interval = interval_s()
        await asyncio.sleep(interval or 1.0)
        if not interval:
            continue
        try:
            changed = watch.changed(settle_s())
        except Exception:  # a bug here must not end the watching, nor the process
            log.exception("watching the config files failed")
            continue
        if changed:
            log.info("config files changed; reloading", extra={"files": changed})
            watch.loaded(await reload())
