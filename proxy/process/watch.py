"""Reloading by itself: the config file and every `${file:}` it names are read again every
`server.watch_config_s`, and a change reloads the config as SIGHUP does.

Content is compared, not times: Kubernetes updates a mounted ConfigMap or Secret by pointing its
`..data` symlink at a new directory, so the path stays the same while what it leads to changes,
and a file rewritten twice within one clock tick keeps its mtime and size. Reading is cheap here:
a config and a few secrets, once a second.

The supervisor of several workers watches, and passes a change on as the SIGHUP it already fans
out (proxy/process/workers.py); a single process watches for itself (`reload_on_change`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from proxy.config.files import file_digest

log = logging.getLogger("modelgate.watch")


class FileWatch:
    """What each watched file held when last looked at (a digest; None: it could not be read)."""

    def __init__(self, files: Mapping[str, str | None]) -> None:
        self._seen: dict[str, str | None] = dict(files)

    @property
    def paths(self) -> list[str]:
        return list(self._seen)

    def loaded(self, *reads: Mapping[str, str | None]) -> None:
        """A load read these files as they were then: that is what later reads compare to. Files
        a config no longer names are kept: watching one too many costs a read, one too few a
        missed change."""
        for files in reads:
            self._seen.update(files)

    def changed(self) -> list[str]:
        """The files whose content differs from what was last seen; they are seen now."""
        changed = []
        for path, before in self._seen.items():
            now = file_digest(path)
            if now != before:
                self._seen[path] = now
                changed.append(path)
        return changed


async def reload_on_change(watch: FileWatch, interval_s: Callable[[], float],
                           reload: Callable[[], Awaitable[Mapping[str, str | None]]]) -> None:
    """Until cancelled: every `interval_s()` seconds (0: not now, look at the setting again in a
    second), reload when a watched file changed. `reload` answers the files it read, whether the
    new config was taken or refused (a refused one keeps the last good config running)."""
    while True:
        interval = interval_s()
        await asyncio.sleep(interval or 1.0)
        if not interval:
            continue
        try:
            changed = watch.changed()
        except Exception:  # a bug here must not end the watching, nor the process
            log.exception("watching the config files failed")
            continue
        if changed:
            log.info("config files changed; reloading", extra={"files": changed})
            watch.loaded(await reload())
