"""One JSON codec for the whole gateway (orjson: parses and encodes several times faster than json)."""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError
JSONEncodeError = orjson.JSONEncodeError


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    return orjson.loads(data)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)
