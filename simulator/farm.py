"""In-process simulators for `base_url: simulator` channels, each on its own loopback port.

Traffic to them still crosses real HTTP. A simulator lives as long as the gateway; a
reload that keeps the channel keeps its simulator (and what it stored), with new settings.
"""

from __future__ import annotations

from aiohttp import web

from proxy.config.model import ChannelConfig, SimulatorSettings
from simulator import build_simulator_app
from simulator.core import Simulator


class SimulatorFarm:
    def __init__(self) -> None:
        self.simulators: dict[str, Simulator] = {}
        self._runners: dict[str, tuple[web.AppRunner, str]] = {}

    async def url_for(self, channel: ChannelConfig) -> str:
        settings = channel.simulator or SimulatorSettings()
        if channel.name in self._runners:
            self.simulators[channel.name].settings = settings
            self.simulators[channel.name].key = channel.credential
            return self._runners[channel.name][1]
        sim = Simulator(channel.name, settings, key=channel.credential)
        runner = web.AppRunner(build_simulator_app(sim), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        self.simulators[channel.name] = sim
        self._runners[channel.name] = (runner, url)
        return url

    async def close(self) -> None:
        for runner, _ in self._runners.values():
            await runner.cleanup()
        self._runners.clear()
