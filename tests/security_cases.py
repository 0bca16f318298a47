"""What the security tests share: the tenants' keys, the channel's credential, a gateway in front of
an upstream that records the exact request line it was sent, and raw requests."""

from __future__ import annotations

import base64

import pytest

from tests.raw_http import recording_upstream, send_raw

ALICE, ALICE_TOO, BOB, GEN_ONLY = "sk-alice-0000001", "sk-alice-0000002", "sk-bob-00000001", "sk-gen-00000001"
SECRET = "upstream-secret-9f8e7d"  # the channel's credential
LIMITED, CHEAP = "sk-limited-000001", "sk-cheap-0000001"


TENANTS = f"""
  - {{name: alice, key: {ALICE}, labels: {{tenant: team-a}}, url_delivery: true}}
  - {{name: alice-too, key: {ALICE_TOO}, labels: {{tenant: team-a}}}}
  - {{name: bob, key: {BOB}, url_delivery: true}}
  - {{name: gen-only, key: {GEN_ONLY}, models: ["genmodel-*"]}}
  - {{name: cheap, key: {CHEAP}, models: ["imagegen-1"]}}"""


def config(upstream_url: str, extra: str = "", keys: str = TENANTS) -> str:
    return f"""
keys: {keys}
channels: [{{name: up, base_url: "{upstream_url}", credential: {SECRET}}}]
observability: {{logging: {{access_log: false}}}}
{extra}
"""


@pytest.fixture
async def upstream():
    server, received = recording_upstream()
    async with server:
        yield server, received


@pytest.fixture
async def gw(start_gateway, upstream):
    return await start_gateway(config(upstream[0].url))


def bearer(key: str) -> str:
    return f"Authorization: Bearer {key}\r\n"


VIDEO = b'{"model":"videogen-3.0-generate-001","prompt":"waves"}'
CONTENT = b'{"contents":[{"parts":[{"text":"hi"}]}]}'


def post(target: str, headers: str, body: bytes) -> tuple[bytes, bytes]:
    head = f"POST {target} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode("latin-1"), body


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


async def submit(url: str, key: str, task: str, path: str = "/v1/video/generations") -> None:
    answer = await send_raw(url, *post(path, f"{bearer(key)}X-Test-Task: {task}\r\n", VIDEO))
    assert answer.status == 200, answer.body


async def get(url: str, path: str, key: str):
    return await send_raw(url, f"GET {path} HTTP/1.1\r\n{bearer(key)}".encode().rstrip(b"\r\n"))
