"""Robustness: generated requests from the OpenAPI document, and random JSON and bytes at every endpoint.

Whatever arrives, the gateway answers within a bound and never with a 5xx of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.routes import ROUTES
from tests.conftest import DEMO_KEY

# URL delivery is on for the key, so `response_format: url` gets a URL rather than the spec's 503.
FUZZ_CONFIG = """
server: {listen: "127.0.0.1:{PORT}"}
observability: {logging: {access_log: false}}
keys: [{name: demo, key: sk-demo-key, url_delivery: true}]
plugins: {url_delivery: {enabled: true, dir: "{IMAGES}"}}
channels:
  - {name: simulator, base_url: simulator, accepts_response_format: false,
     simulator: {chunk_delay_ms: 0, output_tokens: 3, video_queued_s: 0, video_processing_s: 0}}
"""
# schemathesis cannot place a key in a query parameter it also fuzzes: the content-generation
# routes run without auth there (auth has its own tests).
SCHEMATHESIS_ROUTES = """
routes:
  generate_content: {public: true, plugins: [validation, usage, sse]}
  stream_generate_content: {public: true, plugins: [validation, usage, sse]}
"""


def test_generated_requests_never_get_a_5xx_or_break_the_document(spawn, tmp_path):
    gw = spawn("gateway", config=(FUZZ_CONFIG + SCHEMATHESIS_ROUTES).replace("{IMAGES}", str(tmp_path / "images")))
    document = tmp_path / "openapi.json"
    subprocess.run(
        [sys.executable, "-m", "proxy", "openapi", "-o", str(document)], check=True, cwd=Path(__file__).parent.parent
    )
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            str(document),
            "--url",
            gw.url,
            "-H",
            f"Authorization: Bearer {DEMO_KEY}",
            "-H",
            f"x-api-key: {DEMO_KEY}",
            "-H",
            "msgapi-version: 2023-06-01",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "8",
            "--request-timeout",
            "10",
            "--seed",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout


@pytest.fixture(scope="module")
def fuzz_gateway(tmp_path_factory):
    import textwrap

    from tests.conftest import free_port, wait_ready

    port = free_port()
    directory = tmp_path_factory.mktemp("fuzz")
    config = directory / "gateway.yaml"
    config.write_text(
        textwrap.dedent(FUZZ_CONFIG).replace("{PORT}", str(port)).replace("{IMAGES}", str(directory / "images"))
    )
    log = directory / "gateway.log"
    # No admin listener: what is fuzzed is the clients' interface (and two runs never meet on its port).
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config), "--admin-listen", ""],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).parent.parent,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/healthz", proc, log)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def concrete(path: str) -> str:
    return path.replace("{task_id}", "task_x").replace("{model}", "genmodel-2.0-flash").replace("{provider}", "acme")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "model",
        "prompt",
        "messages",
        "max_tokens",
        "contents",
        "input",
        "n",
        "size",
        "stream",
        "tools",
        "metadata",
        "generationConfig",
        "images",
        "thinking",
        "tool_choice",
        "text",
    ]
)
PLAUSIBLE = st.dictionaries(FIELDS, JSON, max_size=6).map(lambda d: {"model": "msgmodel-sonnet-4-5", **d})
BODIES = st.one_of(
    st.binary(max_size=512),
    JSON.map(lambda v: json.dumps(v).encode()),
    PLAUSIBLE.map(lambda v: json.dumps(v).encode()),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    route=st.sampled_from(ROUTES),
    body=BODIES,
    content_type=st.sampled_from(["application/json", "multipart/form-data; boundary=x", "text/plain", None]),
)
def test_random_bodies_never_get_a_5xx_or_hang(fuzz_gateway, route, body, content_type):
    url = fuzz_gateway + concrete(route.path) + f"?alt=sse&key={DEMO_KEY}"
    headers = {"Authorization": f"Bearer {DEMO_KEY}", "x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01"}
    if content_type:
        headers["Content-Type"] = content_type
    data = body if route.method == "POST" else None
    request = urllib.request.Request(url, data=data, headers=headers, method=route.method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # a hang fails here
            answer.read()
            status = answer.status
    except urllib.error.HTTPError as error:
        error.read()
        status = error.code
    assert status < 500, (route.name, body[:200], status)
