"""README's tour runs verbatim: `examples/tour.sh` against the gateway on its embedded defaults."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


async def test_every_tour_command_succeeds_against_the_embedded_defaults(spawn):
    gateway = spawn("defaults")
    tour = await asyncio.create_subprocess_exec(
        "bash", str(EXAMPLES / "tour.sh"), gateway.url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(tour.communicate(), 120)
    assert tour.returncode == 0, output.decode()[-3000:]
    assert output.decode().rstrip().endswith("tour: every call succeeded")
    log = gateway.log.read_text()
    assert f"modelgate listening on {gateway.url}" in log  # the startup line names the base URL
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines and all(
        line.get("logger", "").startswith("modelgate") for line in lines if line.get("logger") != "aiohttp.server"
    ), "every line names the part it comes from"
    assert {"modelgate.access", "modelgate.server"} <= {line.get("logger") for line in lines}


def test_readme_tour_and_the_script_run_the_same_calls():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    tour = readme.split("## A short tour", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    script = (EXAMPLES / "tour.sh").read_text()
    calls = lambda text: re.findall(r"\$B(/[^\s\"']*)", text)  # noqa: E731
    assert calls(tour) and calls(tour) == calls(script)
