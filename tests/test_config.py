"""Config: every problem with its key path; ${VAR} secrets; SIGHUP reload that never drops a stream."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import pytest

from proxy.config import ConfigError, GatewayConfig
from proxy.registry import load_config, parse_config

ROOT = Path(__file__).parent.parent


def check_config(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_check_config_lists_every_problem_with_its_key_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        textwrap.dedent("""
        server: {listen: "127.0.0.1:8080"}
        channels:
          - {name: one, base_url: simulator}
          - {name: two, base_url: "ftp://example.com", credential: "${UNDEFINED_SECRET_FOR_TEST}"}
          - {name: three, base_url: simulator, weigth: 2}
        routes:
          messages: {plugins: [no_such_plugin]}
    """)
    )
    result = check_config(bad)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any(line.strip().startswith("channels[1].base_url: not an http(s) URL") for line in lines)
    assert any("channels[1].credential: undefined variable UNDEFINED_SECRET_FOR_TEST" in line for line in lines)
    assert any("channels[2].weigth: unknown key (did you mean 'weight'?)" in line for line in lines)
    assert any(line.strip().startswith("routes.messages.plugins[0]: unknown plugin 'no_such_plugin'") for line in lines)


def test_check_config_accepts_the_shipped_config():
    result = check_config(ROOT / "config.yaml")
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_shipped_config_is_the_embedded_defaults():
    assert load_config(ROOT / "config.yaml", {}).config == GatewayConfig()


def test_variables_expand_with_defaults_and_escapes():
    config = parse_config(
        """
        channels:
          - {name: a, base_url: "${BASE:-http://127.0.0.1:9}", credential: "${SECRET}", rename: {x: "$${literal}"}}
    """,
        {"SECRET": "s3cret"},
    )
    channel = config.channels[0]
    assert channel.base_url == "http://127.0.0.1:9" and channel.credential == "s3cret"
    assert channel.rename == {"x": "${literal}"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: {listen: 'nohost'}", "server.listen: not a HOST:PORT address"),
        (
            "channels: [{name: a, base_url: simulator}, {name: a, base_url: simulator}]",
            "channels: channel name 'a' is used twice",
        ),
        ("channels: [{name: a}]", "channels[0].base_url: required"),
        (
            "channels: [{name: a, base_url: 'http://x', simulator: {latency_ms: 1}}]",
            "channels[0]: 'simulator' settings apply only with base_url: simulator",
        ),
        ("state: {backend: etcd}", "state.backend: 'etcd' is not one of"),
        ("routes: {mesages: {}}", "routes.mesages"),
        ("plugins: {sse: {anything: 1}}", "plugins.sse.anything: unknown key"),
        ("[1, 2]", "<root>: must be a mapping"),
        ("server: {listen: [}", "not valid YAML"),
        (
            "observability: {tracing: {headers: {'x key': v}}}",
            "observability.tracing.headers: 'x key' is not a header name",
        ),
        (
            'observability: {tracing: {headers: {x-key: "a\\r\\nInjected: 1"}}}',
            "observability.tracing.headers: the value of x-key holds a line break",
        ),
        (
            "channels: [{name: a, base_url: 'http://x', health_check: {path: /h, headers: {'a:b': v}}}]",
            "channels[0].health_check.headers: 'a:b' is not a header name",
        ),
        (
            "console: {oidc: {issuer: 'https://id.example', client_id: c, redirect_url: 'https://a.example/console/oidc/callback'}}",
            "console.oidc: the console is served only with a key store",
        ),
        ("console: {trace_url: 'https://traces.example/trace'}", "console.trace_url: an http(s) URL with {trace_id}"),
        (
            "console: {oidc: {issuer: 'id.example', client_id: c, redirect_url: 'https://a.example/cb'}}",
            "console.oidc.issuer: an http(s) URL",
        ),
    ],
)
def test_config_problems_name_the_key(text, expected):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


RELOADABLE = """
server: {{listen: "127.0.0.1:{{PORT}}"}}
observability: {{logging: {{access_log: false}}}}
channels:
  - name: sim
    base_url: "{sim}"
    models: {models}
"""


async def test_sighup_reloads_without_dropping_in_flight_streams(spawn, tmp_path):
    sim = spawn("simulator")
    gw = spawn("gateway", config=RELOADABLE.format(sim=sim.url, models='["msgmodel-*"]'))
    config_file = Path(gw.proc.args[-1])
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {
        "x-api-key": "sk-demo-key",
        "msgapi-version": "2023-06-01",
        "x-sim-chunk-delay-ms": "100",
        "x-sim-output-tokens": "20",
    }
    async with aiohttp.ClientSession() as http:
        streams = [await http.post(gw.url + "/v1/messages", json=body, headers=headers) for _ in range(5)]
        for answer in streams:
            await answer.content.readuntil(b"\n\n")
        # Now serve only respmodel-*: the streams in flight must finish on the old config.
        config_file.write_text(
            textwrap.dedent(RELOADABLE.format(sim=sim.url, models='["respmodel-*"]')).replace(
                "{PORT}", gw.url.rsplit(":", 1)[1]
            )
        )
        gw.proc.send_signal(signal.SIGHUP)
        await wait_for_model(http, gw.url, "respmodel-4o", served=True)
        for answer in streams:
            rest = await answer.read()
            assert rest.rstrip().endswith(b'data: {"type":"message_stop"}')
        async with http.post(gw.url + "/v1/messages", json=body, headers=headers) as answer:
            assert answer.status == 404  # the new config no longer serves msgmodel-*

        # An invalid config is refused and the running one kept.
        config_file.write_text("channels: [{name: broken, base_url: 'not a url'}]\n")
        gw.proc.send_signal(signal.SIGHUP)
        for _ in range(50):
            if b"config reload refused" in gw.log.read_bytes():
                break
            await asyncio.sleep(0.1)
        assert b"channels[0].base_url: not an http(s) URL" in gw.log.read_bytes()
        await wait_for_model(http, gw.url, "respmodel-4o", served=True)


async def wait_for_model(http: aiohttp.ClientSession, url: str, model: str, served: bool) -> None:
    for _ in range(100):
        async with http.post(
            url + "/v1/responses", json={"model": model, "input": "x"}, headers={"Authorization": "Bearer sk-demo-key"}
        ) as answer:
            if (answer.status == 200) == served:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{model} never became {'served' if served else 'unserved'}")


def test_a_listen_override_is_no_part_of_the_file_check_config_reads(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("server: oops\n")
    result = check_config(path, {"MODELGATE_LISTEN": "127.0.0.1:1"})
    assert result.returncode == 1 and "server" in result.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--listen", "garbage"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert refused.returncode == 1 and refused.stderr.startswith("--listen: ")


def test_check_config_warns_when_a_shared_service_would_serve_the_demo_key(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("key_store: {database_url: 'postgresql://u@127.0.0.1:5432/keys'}\n")
    result = check_config(path)
    assert result.returncode == 0 and "warning: keys: the embedded demo key (demo, sk-demo-key" in result.stderr
    path.write_text("key_store: {database_url: 'postgresql://u@127.0.0.1:5432/keys'}\nkeys: []\n")
    assert "demo key" not in check_config(path).stderr
