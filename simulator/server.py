"""`modelgate simulate`: the simulator as a process of its own."""

from __future__ import annotations

import argparse

from aiohttp import web

from proxy.config.model import SimulatorSettings
from simulator import build_simulator_app
from simulator.core import Simulator


def run_simulator(args: argparse.Namespace) -> None:
    from proxy.process.server import install_uvloop

    install_uvloop()
    settings = SimulatorSettings(
        latency_ms=args.latency_ms,
        chunk_delay_ms=args.chunk_delay_ms,
        output_tokens=args.output_tokens,
        video_queued_s=args.video_queued_s,
        video_processing_s=args.video_processing_s,
    )
    sim = Simulator(args.name, settings, key=args.key)
    web.run_app(
        build_simulator_app(sim),
        host=args.host,
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        print=lambda *_: None,
    )
