"""A TCP relay on loopback that can be taken down and brought back on the same port: a server
that goes away and returns, as the gateway sees it, without stopping the real one."""

from __future__ import annotations

import asyncio
import contextlib

from tests.conftest import free_port


class SwitchedRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port, reuse_address=True)

    async def down(self) -> None:
        """Stop listening and cut every connection: new ones are refused, old ones reset."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    async def _link(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._links.update((client_w, server_w))

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(1 << 16):
                    writer.write(data)
                    await writer.drain()
            writer.transport.abort()

        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w), return_exceptions=True)
        self._links.difference_update((client_w, server_w))
