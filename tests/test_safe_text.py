"""Text that is safe where it lands (docs/security.md, "Safe text and redaction"): a client's
model name in access lines and reports, the channel's credential however an upstream spells it
back, what aiohttp's parser refuses, and the passwords in state URLs. Each through real sockets."""

from __future__ import annotations

import base64
import csv
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from prometheus_client import REGISTRY

from proxy.observability.safe_text import csv_cell, shown
from proxy.process import log_guard
from proxy.request.redact import Redactor
from tests.conftest import DEMO_KEY, MESSAGE_HEADERS, REDIS_URL
from tests.raw_http import Received, recording_upstream, send_raw
from tests.security_cases import ALICE, bearer, config, post
from tests.test_ledger import rows_when

ROOT = Path(__file__).parent.parent

# A zero-width space in front of a formula, a right-to-left override, an isolate, a C1 CSI
# (`\x9b2J` clears a VT220's screen), a line separator and a byte-order mark.
HOSTILE = "\u200b=1+1\u202egnp.exe\u2066\x9b2J\u2028\ufeffmsgmodel-haiku-4-5"
SHOWN = r"\u200b=1+1\u202egnp.exe\u2066\x9b2J\u2028\ufeffmsgmodel-haiku-4-5"
RAW = ["\u200b", "\u202e", "\u2066", "\x9b", "\u2028", "\ufeff"]


def test_every_steering_or_invisible_character_is_shown_as_an_escape() -> None:
    for char in (
        "\x00\x1b\x7f\x85\x9b\u00ad\u061c\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u202a\u202e\u2060"
        "\u2066\u2069\ufeff\u3164\U000e0041"
    ):
        assert shown(f"a{char}b").startswith("a\\") and char not in shown(f"a{char}b"), repr(char)
    assert shown("msgmodel-haiku-4-5") == "msgmodel-haiku-4-5" and shown("café 日本") == "café 日本"
    assert shown("a\\u200bb") == "a\\\\u200bb"  # an escape the client typed is told apart from one made here
    assert shown("tab\there") == "tab\\there"
    assert csv_cell("\u200b=1+1") == "'\\u200b=1+1" and csv_cell(" \u00a0@SUM(A1)") == "' \\xa0@SUM(A1)"
    assert csv_cell("-2") == "'-2" and csv_cell("msg-model") == "msg-model" and csv_cell(3) == 3


@pytest.mark.parametrize("form", ["json", "console"])
def test_every_log_line_shows_a_clients_text_safely(form: str) -> None:
    probe = (
        f"import logging; from proxy.config.model import LoggingConfig; "
        f"from proxy.observability.access_log import configure_logging; "
        f"configure_logging(LoggingConfig(format='{form}')); "
        f"logging.getLogger('modelgate.probe').warning('refused %s', {HOSTILE!r}, extra={{'detail': {HOSTILE!r}}})"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert not any(char in ran.stderr for char in RAW) and ran.stderr.count("u202egnp.exe") == 2, ran.stderr


def access_lines(log: Path) -> list[dict[str, object]]:
    return [
        line
        for line in map(json.loads, filter(lambda text: text.startswith("{"), log.read_text().splitlines()))
        if line.get("event") == "request" and line.get("route") == "messages"
    ]


async def test_a_hostile_model_name_is_escaped_in_the_access_line_and_the_usage_report(
    ledger_db, spawn, tmp_path
) -> None:
    text = f"""
server: {{listen: "127.0.0.1:{{PORT}}"}}
channels: [{{name: simulator, base_url: simulator, simulator: {{chunk_delay_ms: 0, output_tokens: 3}}}}]
plugins: {{ledger: {{database_url: "{ledger_db}", flush_interval_s: 0.1, spool_dir: "{tmp_path / "spool"}"}}}}
"""
    gateway = spawn("gateway", config=text)
    chat = {"model": HOSTILE, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(gateway.url + "/v1/messages", json=chat, headers=MESSAGE_HEADERS) as answer:
                assert answer.status == 200, await answer.text()
    assert [r["model"] for r in await rows_when(ledger_db, 2)] == [HOSTILE, HOSTILE]  # stored as sent

    deadline = time.monotonic() + 10
    while len(lines := access_lines(gateway.log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # access lines are written in batches
    assert [line["model"] for line in lines] == [SHOWN, SHOWN]
    logged = gateway.log.read_text()
    assert not any(char in logged for char in RAW)

    config_path = tmp_path / "report.yaml"
    config_path.write_text(text.replace("{PORT}", "1"))

    def report(form: str) -> str:
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "usage",
                "report",
                "-c",
                str(config_path),
                "--since",
                "1h",
                "--by",
                "model",
                "--format",
                form,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert made.returncode == 0, made.stderr
        assert not any(char in made.stdout for char in RAW), form
        return made.stdout

    # The formula guard sees past the zero-width space a spreadsheet would drop.
    assert [row["model"] for row in csv.DictReader(report("csv").splitlines())] == ["'" + SHOWN]
    assert SHOWN in report("table")
    assert [row["model"] for row in json.loads(report("json"))] == [HOSTILE]  # JSON escapes them itself


# The channel's credential, with the characters that percent-encoding, JSON and Base64 each spell otherwise.
CREDENTIAL = "sk-Chan_Secret/Key+2024-abcdef"
RAW_CREDENTIAL = CREDENTIAL.encode()


def b64(data: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


ECHOED = {
    "upper": CREDENTIAL.upper(),
    "lower": CREDENTIAL.lower(),
    "swapped": CREDENTIAL.swapcase(),
    "percent": quote(CREDENTIAL, safe=""),
    "percent every byte, upper-cased": "".join(f"%{b:02x}" for b in CREDENTIAL.upper().encode()),
    "json slash": CREDENTIAL.replace("/", "\\/"),
    # JSON text, as .NET and Gson write it: some characters \u00XX-escaped, hex in either case.
    "json \\u00XX": CREDENTIAL.replace("+", "\\u002B").replace("/", "\\u002f").replace("-", "\\u002D"),
    "json \\u00XX, every character": "".join(f"\\u{ord(c):04x}" for c in CREDENTIAL),
    "base64, json-escaped padding": b64(b"x" + RAW_CREDENTIAL).replace("=", "\\u003d"),
    "hex": RAW_CREDENTIAL.hex(),
    "HEX": RAW_CREDENTIAL.hex().upper(),
    "base64": b64(RAW_CREDENTIAL),
    "base64 unpadded": b64(RAW_CREDENTIAL).rstrip("="),
    "base64 url-safe": b64(RAW_CREDENTIAL, urlsafe=True),
    "base64 percent-encoded": quote(b64(b"xy" + RAW_CREDENTIAL), safe=""),
    "bearer": "Bearer " + b64(RAW_CREDENTIAL),
    "basic user:credential": "Basic " + b64(b"gateway:" + RAW_CREDENTIAL),
    "basic :credential": "Basic " + b64(b":" + RAW_CREDENTIAL),
    "basic u:credential, more after": "Basic " + b64(b"u:" + RAW_CREDENTIAL + b"\x00tail"),
}


def echoing_every_spelling(received: Received) -> bytes:
    """An upstream whose error quotes its credential in every spelling: in its body, one field
    each, and in headers. A large one (past what is held) is redacted as it streams."""
    # JSON text spells a slash `\/` or a character `\u00XX` where the decoded value has the
    # character itself: those are put in as JSON text.
    escaped = {name: f"ESCAPED-{n}-" for n, (name, value) in enumerate(ECHOED.items()) if "\\" in value}
    body = json.dumps({"error": {"message": "bad request", "echo": {**ECHOED, **escaped}}}).encode()
    for name, placeholder in escaped.items():
        body = body.replace(placeholder.encode(), ECHOED[name].encode())
    if received.path == "/v1/messages":
        body = b" . " * 30_000 + b"\n".join(value.encode() + b" . " * 7_001 for value in ECHOED.values())
    headers = (
        f"X-Debug-Authorization: Basic {b64(b'gateway:' + RAW_CREDENTIAL)}\r\n"
        f"X-Debug-Key: {RAW_CREDENTIAL.hex().upper()}\r\nX-Debug-Query: key={quote(CREDENTIAL.upper(), safe='')}\r\n"
    )
    return (
        f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_an_upstream_echoing_its_credential_in_any_spelling_has_each_redacted(start_gateway) -> None:
    server, _ = recording_upstream(echoing_every_spelling)
    async with server:
        gw = await start_gateway(
            config(server.url, "server: {max_json_body_mb: 0.05}").replace(
                "credential: upstream-secret-9f8e7d", f'credential: "{CREDENTIAL}"'
            )
        )
        whole = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
        streamed = await send_raw(
            gw.url,
            *post(
                "/v1/messages",
                f"x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n",
                b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}',
            ),
        )
    assert whole.status == streamed.status == 400
    echoed = whole.json()["error"]["echo"]  # type: ignore[index]
    assert echoed == {
        name: "Bearer [redacted]"
        if name == "bearer"
        else "Basic [redacted]"
        if name.startswith("basic")
        else "[redacted]"
        for name in ECHOED
    }
    assert streamed.body.count(b"[redacted]") == len(ECHOED) and len(streamed.body) > 300_000
    for answer in (whole, streamed):
        assert answer.headers["x-debug-authorization"] == "Basic [redacted]"
        assert answer.headers["x-debug-key"] == "[redacted]" and answer.headers["x-debug-query"] == "key=[redacted]"
        everything = (repr(answer.headers) + answer.body.decode("latin-1")).lower()
        for spelled in ECHOED.values():
            assert spelled.lower() not in everything
        assert "secret" not in everything  # no piece of the credential's own words either


# What .NET's and Gson's encoders write for a credential whose Base64-like characters they escape.
ESCAPING = "Xk9+Lm2/Qr7pZtW4=="


def escaping_encoders(_: Received) -> bytes:
    body = (
        b'{"error": {"message": "key Xk9\\u002BLm2/Qr7pZtW4\\u003D\\u003D is not allowed", '
        b'"gson": "Xk9\\u002bLm2\\/Qr7pZtW4\\u003d\\u003d", "b64": "' + b64(ESCAPING.encode()).encode() + b'"}}'
    )
    return (
        f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-Echo: Xk9\\u002BLm2\\u002FQr7pZtW4==\r\n\r\n"
    ).encode() + body


async def test_a_credential_json_escaped_by_the_upstreams_encoder_is_redacted(start_gateway) -> None:
    server, _ = recording_upstream(escaping_encoders)
    async with server:
        gw = await start_gateway(
            config(server.url).replace("credential: upstream-secret-9f8e7d", f'credential: "{ESCAPING}"')
        )
        answer = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
    assert answer.status == 400
    assert answer.json() == {
        "error": {"message": "key [redacted] is not allowed", "gson": "[redacted]", "b64": "[redacted]"}
    }
    assert answer.headers["x-echo"] == "[redacted]"
    assert b"Lm2" not in answer.body and "Lm2" not in repr(answer.headers)


def test_a_streamed_body_is_redacted_as_the_whole_is_however_it_is_cut() -> None:
    redactor = Redactor(CREDENTIAL)
    body = b" | ".join(value.encode() for value in ECHOED.values()) + b" | end"
    whole = redactor.bytes(body)
    assert whole.count(b"[redacted]") == len(ECHOED)
    for size in (1, 2, 3, 5, 7, 64):
        stream = redactor.stream()
        pieces = [stream.feed(body[i : i + size]) for i in range(0, len(body), size)]
        assert b"".join(pieces) + stream.flush() == whole, size
    assert Redactor("abc").text("ABC YWJj 616263") == "[redacted] YWJj 616263"  # too short to look for encoded
    # A Base64 spelling whose `+` and `/` a JSON encoder escaped (its `+/` come from `>` and `?`).
    spelled = b64(b"sk->>>???").replace("+", "\\u002B").replace("/", "\\u002f")
    assert "\\u002B" in spelled and Redactor("sk->>>???").text(f"key {spelled}.") == "key [redacted]."


# aiohttp's parser refuses these before any endpoint runs: the answer is JSON and quotes nothing.


async def test_a_request_aiohttp_refuses_gets_json_without_its_bytes(gateway) -> None:
    long_line = f"POST /v1/messages HTTP/1.1\r\nx-api-key: {DEMO_KEY}\r\nx-note: {DEMO_KEY}".encode() + b"K" * 40_000
    control = f"POST /v1/messages HTTP/1.1\r\nx-api-key: {DEMO_KEY}\r\nx-note: {DEMO_KEY}\x01more".encode()
    in_target = f"GET /v1/models?key={DEMO_KEY}\x01 HTTP/1.1".encode()
    for head, status, code in (
        (long_line, 431, "request_header_fields_too_large"),
        (control, 400, "malformed_request"),
        (in_target, 400, "malformed_request"),
    ):
        answer = await send_raw(gateway.url, head)
        assert (answer.status, answer.headers["content-type"]) == (status, "application/json")
        assert answer.json()["error"]["code"] == code  # type: ignore[index]
        assert DEMO_KEY.encode() not in answer.body and b"KKKK" not in answer.body and b"\x01" not in answer.body
    async with aiohttp.ClientSession() as http, http.get(gateway.url + "/healthz") as answer:
        assert answer.status == 200  # and the gateway goes on


async def test_the_admin_listener_refuses_what_the_parser_refuses_in_json_too(gateway) -> None:
    control = b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer sk-secret\x01x"
    long_line = b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer sk-secret" + b"K" * 40_000
    in_target = b"GET /metrics?token=sk-secret\x01 HTTP/1.1"
    for head, status, code in (
        (control, 400, "malformed_request"),
        (long_line, 431, "request_header_fields_too_large"),
        (in_target, 400, "malformed_request"),
    ):
        answer = await send_raw(gateway.admin, head)
        assert (answer.status, answer.headers["content-type"]) == (status, "application/json"), answer
        assert answer.json()["error"]["code"] == code  # type: ignore[index]
        assert b"sk-secret" not in answer.body and b"KKKK" not in answer.body and b"\x01" not in answer.body
    async with aiohttp.ClientSession() as http, http.get(gateway.admin + "/metrics") as answer:
        assert answer.status == 200  # and the listener goes on


async def test_malformed_requests_are_a_clients_fault_logged_once_per_kind_a_while_and_all_counted(
    gateway, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, clock
) -> None:
    """Anyone can send thousands: they must not flood the log at error, nor trip alerts on it."""
    monkeypatch.setattr(log_guard._FILTER, "clock", clock, raising=False)  # other tests' refusals are not this one's
    monkeypatch.setattr(log_guard._FILTER, "logged_at", {}, raising=False)
    monkeypatch.setattr(log_guard._FILTER, "unlogged", {}, raising=False)
    control = f"POST /v1/messages HTTP/1.1\r\nx-api-key: {DEMO_KEY}\x01more".encode()
    bad_target = b"GET /v1/models\x01 HTTP/1.1"

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("malformed request refused")]

    with caplog.at_level(logging.INFO):
        for _ in range(20):
            assert (await send_raw(gateway.url, control)).status == 400
        assert len(said()) == 1
        kind = said()[0].kind  # type: ignore[attr-defined]
        counted = REGISTRY.get_sample_value("modelgate_malformed_requests_total", {"kind": kind})
        clock.advance(log_guard.SAMPLE_S - 1)
        assert (await send_raw(gateway.admin, control)).status == 400  # the admin listener's count too
        clock.advance(1)
        for _ in range(3):
            assert (await send_raw(gateway.url, control)).status == 400
            assert (await send_raw(gateway.url, bad_target)).status == 400
    lines = [(r.levelno, r.kind, r.suppressed, r.getMessage()) for r in said()]  # type: ignore[attr-defined]
    other = lines[-1][1]
    assert other != kind
    # The first of a kind, then the next SAMPLE_S later with the 20 it held back (19, and the admin's).
    assert lines == [
        (logging.WARNING, kind, 0, f"malformed request refused: {kind} (400)"),
        (logging.WARNING, kind, 20, f"malformed request refused: {kind} (400)"),
        (logging.WARNING, other, 0, f"malformed request refused: {other} (400)"),
    ]
    assert not any(r.levelno >= logging.ERROR for r in caplog.records if r.name.startswith("aiohttp"))
    assert REGISTRY.get_sample_value("modelgate_malformed_requests_total", {"kind": kind}) == counted + 4
    assert REGISTRY.get_sample_value("modelgate_malformed_requests_total", {"kind": other}) >= 3


# aiohttp's own 417 for an Expect other than 100-continue was plain text repeating the value.
EXPECT = f"Expect: <script>alert(1)</script>{DEMO_KEY}\r\n"


@pytest.mark.parametrize("listener", ["public", "admin"])
@pytest.mark.parametrize("target", ["/v1/messages", "/nowhere", "/metrics"])
async def test_an_expectation_the_gateway_cannot_meet_is_a_json_417_without_its_value(
    gateway, listener: str, target: str
) -> None:
    url = gateway.url if listener == "public" else gateway.admin
    body = b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'
    head = (
        f"POST {target} HTTP/1.1\r\nx-api-key: {DEMO_KEY}\r\nmsgapi-version: 2023-06-01\r\n{EXPECT}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}"
    ).encode()
    answer = await send_raw(url, head, body)
    assert (answer.status, answer.headers["content-type"]) == (417, "application/json"), answer
    assert answer.json()["error"]["code"] == "expectation_failed"  # type: ignore[index]
    assert answer.json()["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert b"script" not in answer.body and DEMO_KEY.encode() not in answer.body
    assert answer.headers.get("connection", "").lower() == "close"


async def test_100_continue_is_still_met(gateway) -> None:
    chat = {"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gateway.url + "/v1/messages", json=chat, expect100=True, headers=MESSAGE_HEADERS) as answer,
    ):
        assert answer.status == 200, await answer.text()


# State URLs: check-config names what is wrong with one without a piece of its password.

PIECES = ("Sekr1t", "piece2", "Piece3x")


def check_config(tmp_path: Path, url: str, command: str = "check-config") -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"server: {{workers: 1}}\nstate: {{backend: redis, url: '{url}'}}\n"
        f"plugins: {{webhook_queue: {{enabled: true, url: '{url}'}}}}\n"
    )
    args = ["check-config", str(path)] if command == "check-config" else ["serve", "-c", str(path)]
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:pw@s1:26379,s2/main?sentinel_password=Sekr1t&piece2=Piece3x",
        "redis+sentinel://:pw@s1:26379/main?sentinel_password=Sekr1t&piece2&Piece3x",
        "rediss+cluster://u:Sekr1t&piece2@n1:7000?Piece3x=1&sentinel_password=x",
        "redis://:Sekr1t?piece2=Piece3x@127.0.0.1:6379/0",
        "redis://:Sekr1t#piece2/Piece3x@127.0.0.1:6379/0",
        "redis://:Sekr1t/piece2?Piece3x@127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/0?password=Sekr1t&piece2=Piece3x",
    ],
)
def test_check_config_names_a_bad_state_url_without_any_piece_of_its_password(tmp_path, url) -> None:
    checked = check_config(tmp_path, url)
    said = checked.stdout + checked.stderr
    assert checked.returncode == 1 and "state.url: " in said and "plugins.webhook_queue.url: " in said, said
    assert not any(piece in said for piece in PIECES) and "Traceback" not in said, said


def test_a_state_url_option_redis_could_not_read_fails_check_config_and_start_cleanly(tmp_path) -> None:
    for command in ("check-config", "serve"):
        checked = check_config(tmp_path, f"{REDIS_URL}?socket_timeout=abc", command)
        assert checked.returncode == 1, checked.stderr
        assert "state.url: option socket_timeout: not a number of seconds above 0" in checked.stderr
        assert "Traceback" not in checked.stderr
    for option, why in (
        ("health_check_interval=1.5", "not a whole number"),
        ("retry_on_timeout=maybe", "not one of"),
        ("protocol=3", "unknown option 'protocol'"),
        ("socket_timeout=1&socket_timeout=2", "given twice"),
    ):
        assert why in check_config(tmp_path, f"{REDIS_URL}?{option}").stderr, option


async def test_the_options_a_state_url_may_carry_reach_redis(spawn, redis_url) -> None:
    import redis.asyncio as aioredis

    options = "socket_timeout=2&socket_connect_timeout=1.5&health_check_interval=30&retry_on_timeout=yes&client_name=mg-safe-text"
    gateway = spawn(
        "gateway",
        config=f"""
server: {{listen: "127.0.0.1:{{PORT}}", workers: 1}}
state: {{backend: redis, url: "{redis_url}?{options}"}}
""",
    )
    async with aiohttp.ClientSession() as http:
        async with http.post(
            gateway.url + "/v1/responses",
            json={"model": "respmodel-4o", "input": "hi"},
            headers={"Authorization": f"Bearer {DEMO_KEY}"},
        ) as answer:
            assert answer.status == 200
            made = (await answer.json())["id"]
        async with http.post(
            gateway.url + "/v1/responses",
            headers={"Authorization": f"Bearer {DEMO_KEY}"},
            json={"model": "respmodel-4o", "input": "again", "previous_response_id": made},
        ) as answer:
            assert answer.status == 200  # the chain was kept in Redis
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert "mg-safe-text" in {c["name"] for c in await client.client_list()}
    finally:
        await client.aclose()
