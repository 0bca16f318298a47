"""The admin API's OpenAPI document (`modelgate openapi --admin`): it names every route the admin
listener serves, is a valid document, and what a generator makes from it gets answers that
conform to it, never a server error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from openapi_spec_validator import validate

from proxy.keystore.api import PREFIX, AdminApi
from proxy.keystore.openapi import admin_openapi_document
from tests.test_key_store import OWNER, config


def test_the_document_names_every_route_of_the_admin_api_and_is_valid() -> None:
    document = admin_openapi_document()
    validate(document)
    served = {
        (method.lower(), PREFIX + path) for method, path, _ in AdminApi(None, lambda r: None, reads=object()).routes()
    }  # type: ignore[arg-type]
    documented = {(method, path) for path, operations in document["paths"].items() for method in operations}
    assert documented == served


def test_generated_admin_requests_get_answers_the_document_describes(spawn, redis_url, ledger_db, tmp_path):
    gateway = spawn("gateway", config=config(redis_url, ledger_db, tmp_path.name))
    document = tmp_path / "admin.json"
    subprocess.run(
        [sys.executable, "-m", "proxy", "openapi", "--admin", "-o", str(document)],
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            str(document),
            "--url",
            gateway.admin,
            "-H",
            f"Authorization: Bearer {OWNER}",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "10",
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
