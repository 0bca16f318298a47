"""The dashboard and alert rules against a real Prometheus scraping a gateway's admin listener under
mixed load: every expression parses and returns data (no empty panel). promtool checks and tests the rules."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.conftest import DEMO_KEY, free_port

DASHBOARDS = Path(__file__).parent.parent / "dashboards"
pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="the prometheus Debian package is not installed (.ci/run installs it)",
)


def test_promtool_checks_and_tests_the_alert_rules():
    check = subprocess.run(
        ["promtool", "check", "rules", "alerts.yaml"], cwd=DASHBOARDS, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yaml"], cwd=DASHBOARDS, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every dashboard target and every alert rule's measured side."""
    found = []
    dashboard = json.loads((DASHBOARDS / "modelgate.json").read_text())
    # The dashboard's job, instance and environment variables, at "All" (what a first visit shows).
    chosen = {"$__rate_interval": "30s"} | {
        f"${variable['name']}": variable["allValue"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    }
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name in sorted(chosen, key=len, reverse=True):
                expr = expr.replace(name, chosen[name])
            assert "$" not in expr, f"panel {panel['title']!r}: a variable the dashboard does not define"
            found.append((f"panel {panel['title']!r}", expr))
    for group in yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']} (whole)", rule["expr"]))
            measured = re.sub(r"\s*(>|<|>=|<=|==|!=)\s*[\d.]+\s*$", "", rule["expr"])
            found.append((f"alert {rule['alert']} (measured)", measured))
    return found


async def mixed_load(url: str, seconds: float) -> None:
    bearer = {"Authorization": f"Bearer {DEMO_KEY}"}
    msg = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01"}
    message = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    calls = [
        ("/v1/messages", msg, message),
        ("/v1/messages", msg, {**message, "stream": True}),
        ("/v1/responses", bearer, {"model": "respmodel-4o", "input": "hi", "stream": True}),
        (
            f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}",
            {},
            {"contents": [{"parts": [{"text": "x"}]}]},
        ),
        (
            f"/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={DEMO_KEY}",
            {},
            {"contents": [{"parts": [{"text": "x"}]}]},
        ),
        ("/v1/images/generations", bearer, {"model": "imagegen-2", "prompt": "x", "size": "1024x1024"}),
        ("/v1/images/generations", bearer, {"model": "imagegen-2", "prompt": "x", "response_format": "url"}),
        ("/v1/video/generations", bearer, {"model": "videogen-3.0-generate-001", "prompt": "x"}),
        ("/v1/responses", {**bearer, "x-sim-fault": "status=503"}, {"model": "respmodel-4o", "input": "x"}),
        ("/v1/messages", msg, {**message, "max_tokens": 0}),
        ("/v1/responses", bearer, {"model": "respmodel-4o", "input": "x", "reasoning": {"effort": "tomorrow"}}),
        ("/v1/messages", {"msgapi-version": "1"}, message),
        ("/v1/responses", {"Authorization": "Bearer tight-key-001"}, {"model": "respmodel-4o", "input": "x"}),
    ]
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as http:
        for prompt in ("waves", "waves [sim:filtered]", "waves [sim:fail]"):  # every video outcome
            async with http.post(
                url + "/v1/video/generations",
                headers=bearer,
                json={"model": "videogen-3.0-generate-001", "prompt": prompt},
            ) as answer:
                task_id = (await answer.json())["task_id"]
            async with http.get(f"{url}/v1/video/generations/{task_id}", headers=bearer) as answer:
                await answer.read()
        while time.monotonic() < deadline:
            for path, headers, body in calls:
                async with http.post(url + path, json=body, headers=headers) as answer:
                    await answer.read()
            # one client that leaves mid-stream
            answer = await http.post(
                url + "/v1/messages",
                json={**message, "stream": True},
                headers={**msg, "x-sim-chunk-delay-ms": "50", "x-sim-output-tokens": "20"},
            )
            await answer.content.readuntil(b"\n\n")
            answer.close()
            await asyncio.sleep(0.05)


async def test_every_dashboard_and_alert_expression_returns_data(ledger_db, spawn, tmp_path):
    gateway = spawn(
        "gateway",
        config="""
        server: {listen: "127.0.0.1:{PORT}"}
        observability: {logging: {access_log: false}}
        keys: [{name: demo, key: sk-demo-key, url_delivery: true, limits: {rpm: 100000, tpm: 10000000},
                budget: {cost_per_day: 1000}},
               {name: tight, key: tight-key-001, limits: {rpm: 1}}]
        channels: [{name: simulator, base_url: simulator, accepts_response_format: false,
                    simulator: {chunk_delay_ms: 2, output_tokens: 4, video_queued_s: 0, video_processing_s: 0}}]
        plugins: {url_delivery: {enabled: true, dir: "IMAGES_DIR"},
                  ledger: {database_url: "LEDGER_DB", flush_interval_s: 0.2, spool_dir: "SPOOL_DIR"}}
        prices: [{model: "*", input_per_mtok: 1, output_per_mtok: 2, per_image: 0.01, per_video_second: 0.1}]
    """.replace("IMAGES_DIR", str(tmp_path / "images"))
        .replace("LEDGER_DB", ledger_db)
        .replace("SPOOL_DIR", str(tmp_path / "spool")),
    )
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(DASHBOARDS / "alerts.yaml")],
                # The admin listener, as the shipped deploy files scrape it: the clients' port serves no /metrics.
                "scrape_configs": [
                    {"job_name": "modelgate", "static_configs": [{"targets": [gateway.admin.removeprefix("http://")]}]}
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(api + "/-/ready") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
            await mixed_load(gateway.url, seconds=10)
            await asyncio.sleep(2.5)  # the last scrapes
            async with http.get(api + "/api/v1/targets") as answer:
                (target,) = (await answer.json())["data"]["activeTargets"]
            assert target["health"] == "up" and target["scrapeUrl"] == gateway.admin + "/metrics", target
            async with http.get(gateway.url + "/metrics") as answer:
                assert answer.status == 404
            empty = []
            for where, expr in expressions():
                async with http.get(api + "/api/v1/query", params={"query": expr}) as answer:
                    body = await answer.json()
                assert body["status"] == "success", (where, expr, body)
                if "(whole)" in where:
                    continue  # an alert's full expression is empty unless it fires: parsing is what counts
                values = [float(r["value"][1]) for r in body["data"]["result"]]
                if not values or all(math.isnan(v) for v in values):
                    empty.append(f"{where}: {expr}")
            assert not empty, "expressions without data:\n" + "\n".join(empty)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=20)
