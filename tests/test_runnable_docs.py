"""The documents' commands run as written: every fenced block marked `sh runnable` in README.md
and docs/, in the order each document gives them, one document's blocks in one shell (so an
`export` holds for the blocks after it), against a gateway of this test's own with a key store
and a ledger. The only change made to them: the documented addresses (127.0.0.1:8080 for
clients, 127.0.0.1:8081 for the admin listener) become that gateway's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```sh runnable\n(.*?)^```", re.M | re.S)
OWNER = "owner-token-0123456789abcdef"

# What the documents call config.yaml: the key store and the ledger in one PostgreSQL database.
CONFIG = """\
server:
  admin_listen: 127.0.0.1:8081
  admin_token: ${MODELGATE_ADMIN_TOKEN}
key_store:
  database_url: ${MODELGATE_DATABASE_URL}
plugins:
  ledger: {database_url: "${MODELGATE_DATABASE_URL}", flush_interval_s: 0.2}
"""


def runnable(document: Path) -> list[str]:
    return BLOCK.findall(document.read_text(encoding="utf-8"))


def test_the_documents_mark_commands_runnable() -> None:
    found = {document.name: len(runnable(document)) for document in DOCUMENTS if runnable(document)}
    assert found.get("administration.md", 0) >= 8, found  # the day-2 tasks, from bootstrap to revoke


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if runnable(d)], ids=lambda d: d.name)
async def test_a_document_s_runnable_commands_run_against_a_gateway(document: Path, spawn, ledger_db, tmp_path):
    gateway = spawn("gateway", config=_gateway_config(ledger_db))
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text(CONFIG)
    script = "\n".join(runnable(document))
    script = script.replace("http://127.0.0.1:8081", gateway.admin).replace("http://127.0.0.1:8080", gateway.url)
    bin_dir = str(Path(sys.executable).parent)  # `modelgate`, as the install puts it beside the venv's python
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=work,
        env={
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "HOME": str(tmp_path),
            "MODELGATE_ADMIN_TOKEN": OWNER,
            "MODELGATE_DATABASE_URL": ledger_db,
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"{document.name}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _gateway_config(database_url: str) -> str:
    return (
        CONFIG.replace(
            "admin_listen: 127.0.0.1:8081", "listen: '127.0.0.1:{PORT}'\n  admin_listen: '127.0.0.1:{ADMIN_PORT}'"
        )
        .replace("${MODELGATE_ADMIN_TOKEN}", OWNER)
        .replace("${MODELGATE_DATABASE_URL}", database_url)
    )
