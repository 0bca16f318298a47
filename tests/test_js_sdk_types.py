"""The request types of the JavaScript SDKs (openai, @anthropic-ai/sdk, @google/genai), read from
their TypeScript declarations as data: every value a JavaScript SDK can put in a field the gateway
checks as an enumeration goes through the gateway, and none gets a 400 (nor a 5xx) unless a hard
rule of the interface refuses it.

The fields, and where each SDK types them, are the table tests/test_sdk_types.py sends the Python
SDKs' values by (tests/sdk_fields.py: each field's `js`); this test sends the union of both lists,
so a value only one language's SDK has is covered too. The declarations are those of the clients
tests/test_js_clients.py drives, installed from tests/js/package-lock.json; tests/ts_declarations.py
reads them, and a location that no longer resolves (a renamed type) fails here, loudly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.js_install import installed
from tests.sdk_fields import CHECKED_IN_VALIDATORS, CONFIG, MAPPING, Js, NoJs, Sdk, refusals, sdk_values
from tests.ts_declarations import Declarations

FIELDS = {**MAPPING, **CHECKED_IN_VALIDATORS}


@pytest.fixture(scope="module")
def declarations() -> Declarations:
    try:
        folder = installed()  # once per machine (.ci/run does it first); again only when the lock file changes
    except RuntimeError as missing:  # no node or npm here: no declarations to read
        pytest.skip(f"the JavaScript SDKs are not installed and cannot be: {missing}")
    return Declarations(folder / "node_modules")


def js_values(declarations: Declarations, source: Js) -> set[str]:
    return declarations.values(source.file, source.kind, source.path)


def test_the_declarations_read_are_the_locked_majors(declarations: Declarations) -> None:
    majors = {
        name: int(json.loads((declarations.root / name / "package.json").read_text())["version"].split(".")[0])
        for name in ("openai", "@anthropic-ai/sdk", "@google/genai")
    }
    assert majors == {"openai": 7, "@anthropic-ai/sdk": 1, "@google/genai": 3}


def test_every_field_names_where_the_js_sdks_type_it_or_why_none_does(declarations: Declarations) -> None:
    typed = 0
    for key, case in FIELDS.items():
        if isinstance(case.js, NoJs):
            assert case.js.why, key
            continue
        values = js_values(declarations, case.js)  # Unresolved: the SDK renamed or moved it
        assert values, f"{key}: {case.js.kind} has no string values at {case.js.path!r}"
        assert set(case.js.beyond) <= values, f"{key}: a refused value the JavaScript SDK no longer has"
        typed += 1
    assert typed >= 40  # the three SDKs' fields, not a few


def test_where_both_languages_type_a_field_their_lists_share_values(declarations: Declarations) -> None:
    """Both SDKs are made from the same API definitions: lists that share nothing mean one of
    the two locations names another field. (Lists that differ are fine: the send test covers
    their union.)"""
    for key, case in FIELDS.items():
        if isinstance(case.js, Js) and isinstance(case.source, Sdk):
            js, python = js_values(declarations, case.js), sdk_values(case.source)
            assert js & python, f"{key}: the SDKs share no value ({sorted(js)} and {sorted(python)})"


async def test_every_value_the_js_sdks_can_send_passes_the_gateway(
    declarations,
    start_gateway,
    http,
    tmp_path: Path,
) -> None:
    gw = await start_gateway(CONFIG % (tmp_path / "images"))
    wrong: list[str] = []
    sent = 0
    for key, case in FIELDS.items():
        if not isinstance(case.js, Js):
            continue
        values = js_values(declarations, case.js)
        beyond = dict(case.js.beyond)
        if isinstance(case.source, Sdk):  # the union of both SDKs' values, each refusal's rule from either
            values |= sdk_values(case.source)
            beyond |= case.source.beyond
        wrong += await refusals(http, gw.url, key, case, sorted(values), beyond)
        sent += len(values)
    assert wrong == []
    assert sent > 150  # every SDK's lists, not a few
