"""Counts a client writes in a request (output limits, answers asked for), read as an upstream may
read them: budgets and limits reserve by what the upstream will honour, not by what a schema
would have parsed."""

from __future__ import annotations

import math
import re
from typing import Any

# Every spelling of an output limit any format's upstream reads (the chat-completions format's
# too): at the top of a body, or in either spelling of a content-generation config. A request may
# carry several, and any of them may be the one an upstream honours.
_TOP_LIMITS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
_CONFIGS = ("generationConfig", "generation_config")
_CONFIG_LIMITS = ("maxOutputTokens", "max_output_tokens")
MOST_COUNT = 2**31
_NUMBER = re.compile(r"[+]?(?:[0-9]+[.]?[0-9]*|[.][0-9]+)(?:[eE][+-]?[0-9]+)?")  # ASCII digits, as a JSON parser reads


def at(mapping: Any, path: tuple[str, ...]) -> Any:
    """What a request body holds at `path` (None where it holds nothing, or no object on the way)."""
    for name in path:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(name)
    return mapping


def count(value: Any) -> int | None:
    """A count a client wrote, as a lax upstream may read it: a number (a fraction rounded up), or
    one written as a string (`"40000"`, `"4e4"`); None for anything else (a bool, an object, zero
    or less, not a finite number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and len(value) < 32 and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, float):
        if not math.isfinite(value) or value <= 0:
            return None
        value = math.ceil(min(value, MOST_COUNT))
    if isinstance(value, int) and 0 < value:
        return min(value, MOST_COUNT)
    return None


def largest_limit(body: dict[str, Any]) -> int:
    """The largest output limit a request body names, under any spelling (0: none). Read on every
    request a budget or a token limit holds: plain lookups, a count parsed only where one is."""
    found = 0
    for name in _TOP_LIMITS:
        if (value := body.get(name)) is not None:
            found = max(found, count(value) or 0)
    for name in _CONFIGS:
        if isinstance(config := body.get(name), dict):
            for inner in _CONFIG_LIMITS:
                if (value := config.get(inner)) is not None:
                    found = max(found, count(value) or 0)
    return found


def asked_count(body: Any, *path: str) -> int | None:
    """A count at `path` of a request body (candidates, images, partial images), read as an
    upstream may read it; None when absent or not a count."""
    return count(at(body, path))
