"""Several instances behind a load balancer: limits, affinity and signed URLs hold across them.

Three gateway processes share one Redis and two upstream simulators (processes of their own);
a round-robin TCP balancer in front gives every new connection to the next instance. The
configs shipped in deploy/ are checked to load."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from proxy.registry import parse_config
from tests.conftest import REDIS_URL, free_port

DEPLOY = Path(__file__).parent.parent / "deploy"
KEY = "deploy-key-0001"
LIMITED = "deploy-key-0002"
BEARER = {"Authorization": f"Bearer {KEY}"}


class RoundRobin:
    """A TCP balancer: each new client connection is piped to the next backend in turn."""

    def __init__(self, port: int, backends: list[int]) -> None:
        self.port = port
        self.backends = backends
        self.served: list[int] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _pipe(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        backend = self.backends[len(self.served) % len(self.backends)]
        self.served.append(backend)
        upstream_in, upstream_out = await asyncio.open_connection("127.0.0.1", backend)

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        await asyncio.gather(copy(client_in, upstream_out), copy(upstream_in, client_out))


@pytest.fixture
async def cluster(spawn, redis_url: str) -> AsyncIterator[tuple[str, RoundRobin]]:
    sim_a, sim_b = spawn("simulator", "--name", "a"), spawn("simulator", "--name", "b")
    balancer_port = free_port()
    prefix = f"deploy-{os.getpid()}-{time.monotonic_ns()}:"
    config = f"""
server: {{listen: "127.0.0.1:{{PORT}}", public_base_url: "http://127.0.0.1:{balancer_port}", workers: 1}}
state: {{backend: redis, url: '{REDIS_URL}', prefix: '{prefix}'}}
keys:
  - {{name: open, key: {KEY}, url_delivery: true}}
  - {{name: limited, key: {LIMITED}, limits: {{rpm: 5}}}}
channels:
  - {{name: a, base_url: '{sim_a.url}', accepts_response_format: false}}
  - {{name: b, base_url: '{sim_b.url}', accepts_response_format: false}}
plugins:
  url_delivery: {{enabled: true, store: redis, signing_keys: [{{id: k1, secret: shared-secret-0123456789}}]}}
observability: {{logging: {{access_log: false}}}}
"""
    instances = [spawn("gateway", config=config) for _ in range(3)]
    balancer = RoundRobin(balancer_port, [int(g.url.rsplit(":", 1)[1]) for g in instances])
    await balancer.start()
    yield f"http://127.0.0.1:{balancer_port}", balancer
    await balancer.stop()


async def fresh(method: str, url: str, **kwargs: object) -> tuple[int, bytes, str]:
    """One request on a new connection, so the balancer sends it to the next instance."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.request(method, url, **kwargs) as answer:  # type: ignore[arg-type]
            return answer.status, await answer.read(), answer.content_type


async def test_limits_affinity_and_signed_urls_hold_across_three_instances(cluster: tuple[str, RoundRobin]) -> None:
    base, balancer = cluster
    statuses = [
        (
            await fresh(
                "POST",
                base + "/v1/responses",
                json={"model": "respmodel-4o", "input": "x"},
                headers={"Authorization": f"Bearer {LIMITED}"},
            )
        )[0]
        for _ in range(7)
    ]
    assert statuses.count(200) == 5 and statuses.count(429) == 2  # one limit for the key, not one per instance

    status, body, _ = await fresh(
        "POST",
        base + "/v1/responses",
        headers=BEARER,
        json={"model": "respmodel-4o", "input": "remember this", "store": True},
    )
    assert status == 200
    made = yaml.safe_load(body)["id"]
    for _ in range(6):  # every instance, twice: each must send the follow-up to the channel that knows the id
        status, body, _ = await fresh(
            "POST",
            base + "/v1/responses",
            headers=BEARER,
            json={"model": "respmodel-4o", "input": "and now?", "previous_response_id": made},
        )
        assert status == 200, body

    status, body, _ = await fresh(
        "POST",
        base + "/v1/images/generations",
        headers=BEARER,
        json={"model": "imagegen-2", "prompt": "a fox", "response_format": "url"},
    )
    assert status == 200
    url = yaml.safe_load(body)["data"][0]["url"]
    assert url.startswith(base + "/images/")
    for _ in range(3):  # minted by one instance, served by each
        status, image, kind = await fresh("GET", url)
        assert status == 200 and kind == "image/png" and image.startswith(b"\x89PNG")
    assert len(set(balancer.served)) == 3  # every instance took its share


def test_the_shipped_configs_load() -> None:
    env = {
        "MODELGATE_PUBLIC_URL": "https://models.example.com",
        "MODELGATE_REDIS_URL": "redis://redis:6379/0",
        "TEAM_A_KEY_SHA256": "a" * 64,
        "UPSTREAM_URL": "https://upstream.example.com",
        "UPSTREAM_KEY": "k",
        "URL_SIGNING_SECRET": "s" * 32,
    }
    parse_config((DEPLOY / "gateway.yaml").read_text(), env)
    # deploy/kubernetes/'s config is checked with the files its pods mount: tests/test_kubernetes.py.
