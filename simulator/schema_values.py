"""A JSON value that validates against a schema: the arguments of a simulated tool call and the
text of a simulated structured answer.

Takes plain JSON Schema (tools' `input_schema`, `parameters`, `parametersJsonSchema`,
`text.format.schema`, `responseJsonSchema`: what pydantic emits, with `$defs`, `$ref`, `anyOf`)
and the OpenAPI subset content generation calls `Schema` (upper-case types, `nullable`, numbers
sent as strings). Every property is filled near the top, only required ones deeper down, so a
recursive schema still ends; a value the schema cannot have (`false`, a pattern no candidate
matches) is the closest one it can make, since the schema is the caller's and may be anything.
And since the caller may be hostile (the simulator shares the gateway's event loop on its
embedded defaults), what a schema costs is bounded: every step spends one budget (`_WORK`), the
value holds at most `_SIZE` characters of JSON (optional content stops short of it, required
content comes out shorter), and keywords that are not finite numbers are ignored.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import regex

from proxy.core import jsonutil

_FULL_DEPTH = 6  # every property filled down to here, only the required ones below
_GIVE_UP = 32  # a schema that requires itself forever gets a null at this depth
_WORK = 100_000  # steps one value may take (see _Making): a schema's shape cannot make it take longer
_SIZE = 65_536  # characters of JSON one value may hold
_RESERVE = _SIZE // 4  # kept for what is required: optional properties and items stop short of it
_LONGEST = 16_384  # characters one string may hold
_PATTERN_S = 0.05  # seconds the caller's patterns may take, all of one value's together
_EXACT = 2.0**53  # a numeric keyword past this (or not finite) is no bound a tool means: ignored
_NOTHING: Any = object()  # no value fits what is left of the budget: the holder leaves it out
_STRINGS = ("simulated", "a", "A", "0", "abc", "a-b", "a_b", "A1", "x@example.com")
_CAMEL = {
    re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): k
    for k in (
        "anyOf",
        "oneOf",
        "allOf",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "prefixItems",
        "additionalProperties",
        "additionalItems",
        "propertyOrdering",
    )
}
_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "12:00:00Z",
    "duration": "P1D",
    "email": "sim@example.com",
    "idn-email": "sim@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/sim",
    "iri": "https://example.com/sim",
    "uri-reference": "/sim",
    "iri-reference": "/sim",
    "url": "https://example.com/sim",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "json-pointer": "/sim",
    "relative-json-pointer": "0",
    "regex": "^sim$",
    "byte": "c2ltdWxhdGVk",
}


def value_for(schema: Any) -> Any:
    """A value `schema` accepts (or the closest one this makes: see the module's doc)."""
    value = _value(schema, _Making(schema), 0, 0)
    if value is not _NOTHING:
        return value
    # Nothing fitted (the schema spent the budget before any value was made): the least of its kind.
    kind = _kind(schema, _Making(schema)) if isinstance(schema, dict) else None
    return {"object": {}, "array": [], "integer": 0, "number": 0, "boolean": False}.get(kind or "null")


@dataclass(slots=True)
class _Making:
    """What one value may still cost: `work` (each schema looked at, each `$ref` hop and `allOf`
    part, each key copied or scanned) and `room` (characters of JSON it may still grow by); and
    what was worked out once for the schema's parts, by id (each kept alive beside its answer, so
    an id is never reused while the making lasts)."""

    root: Any
    work: int = _WORK
    room: int = _SIZE
    pattern_s: float = _PATTERN_S  # what is left of the patterns' time
    known: dict[tuple[str, int], tuple[Any, Any]] = field(default_factory=dict)

    def spend(self, steps: int) -> bool:
        self.work -= steps
        return self.work >= 0

    def fits(self, size: int) -> bool:
        """Whether `size` more characters fit; if so they are taken."""
        if size > self.room:
            return False
        self.room -= size
        return True

    def once(self, kind: str, of: Any, make: Any) -> Any:
        key = (kind, id(of))
        if key not in self.known:
            self.known[key] = (of, make())
        return self.known[key][1]


def _value(schema: Any, m: _Making, depth: int, index: int) -> Any:
    """`index` varies the items of one array; `_NOTHING` when the value's budget is spent (a
    hostile schema asks for billions of items, nests `allOf` through `$ref`s, or consts of megabytes)."""
    if not m.spend(1) or m.room <= 0:
        return _NOTHING
    if schema is False or depth > _GIVE_UP:
        return None if m.fits(4) else _NOTHING
    if not isinstance(schema, dict):
        return _text("simulated", m)
    schema = m.once("resolved", schema, lambda: _resolved(schema, m))
    if "const" in schema:
        return _given(schema["const"], m)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        enum = schema["enum"]
        choices = m.once(
            "enum",
            enum,  # picked from once: an item of a long array does not scan it again
            lambda: [v for v in enum if v is not None] or enum if m.spend(len(enum) // 16) else [],
        )
        return _given(choices[index % len(choices)], m) if choices else _NOTHING
    # Combinators count as a level: a `$ref` cycle through them ends at _GIVE_UP too.
    if isinstance(schema.get("allOf"), list):
        return _value(_merged(schema, m), m, depth + 1, index)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            if not m.spend(len(schema)):
                return _NOTHING
            rest = {k: v for k, v in schema.items() if k != key}
            branch = m.once(
                "branch",
                branches,
                lambda branches=branches: next((b for b in branches if m.spend(1) and not _is_null(b, m)), branches[0]),
            )
            resolved = (
                m.once("resolved", branch, lambda branch=branch: _resolved(branch, m))
                if isinstance(branch, dict)
                else branch
            )
            return _value({**rest, **resolved} if isinstance(resolved, dict) else resolved, m, depth + 1, index)
    kind = _kind(schema, m)
    if kind == "null":
        return None if m.fits(4) else _NOTHING
    if kind == "object":
        return _object(schema, m, depth)
    if kind == "array":
        return _array(schema, m, depth)
    if kind in ("integer", "number"):
        number = _number(schema, kind, index)
        return number if m.fits(len(str(number))) else _NOTHING
    if kind == "boolean":
        return True if m.fits(4) else _NOTHING
    return _text(_string(schema, index, m), m)


def _text(text: str, m: _Making) -> Any:
    """A string made here (ASCII, or the caller's own): shortened to the room left, if any is."""
    if m.room < 3 or not m.spend(1 + len(text) // 64):
        return _NOTHING
    text = text[: m.room - 2]
    m.room -= len(text) + 2
    return text


def _given(value: Any, m: _Making) -> Any:
    """A `const` or an `enum` value as the caller gave it, measured once: one that does not fit
    (or that JSON cannot carry back, as a const nested past what the encoder takes) is not given."""

    def size() -> int | None:
        try:
            return len(jsonutil.dumps(value)) if m.spend(1) else None
        except (TypeError, ValueError):  # orjson's JSONEncodeError is a TypeError
            return None

    measured = m.once("size", value, size)
    return value if measured is not None and m.fits(measured) else _NOTHING


def _resolved(schema: dict[str, Any], m: _Making) -> dict[str, Any]:
    """`$ref` followed (a local JSON pointer, as `#/$defs/Name`), its siblings kept; a few hops at
    most; keywords in snake case (as google-genai sends some: `min_items`) in camel case."""
    schema = _camel(schema, m)
    for _ in range(8):
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not m.spend(1 + len(schema) + len(ref) // 64):
            return schema
        target: Any = m.root
        if ref != "#":
            if not ref.startswith("#/"):
                return {k: v for k, v in schema.items() if k != "$ref"}  # remote: not fetched
            for token in ref[2:].split("/"):
                token = token.replace("~1", "/").replace("~0", "~")
                target = target.get(token) if isinstance(target, dict) else None
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**_camel(target, m), **siblings} if isinstance(target, dict) else siblings
    return schema


def _camel(schema: dict[str, Any], m: _Making) -> dict[str, Any]:
    if not m.spend(len(schema)) or not any("_" in key for key in schema):
        return schema
    return {_CAMEL.get(key, key): value for key, value in schema.items()}


def _merged(schema: dict[str, Any], m: _Making, nesting: int = 0) -> dict[str, Any]:
    """`allOf` as one schema: properties and required lists joined, other keys first come first
    kept; each part spends the budget, so a cycle of `allOf` through `$ref`s (which fans out at
    every level) ends when it is spent, if not at the nesting cut."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties = dict(merged.get("properties") or {}) if isinstance(merged.get("properties"), dict) else {}
    required = (
        [n for n in merged.get("required") or [] if isinstance(n, str)]
        if isinstance(merged.get("required"), list)
        else []
    )
    named = set(required)
    for part in schema["allOf"]:
        if not isinstance(part, dict):
            continue
        if not m.spend(1 + len(part)):
            break
        part = m.once("resolved", part, lambda p=part: _resolved(p, m))
        if isinstance(part.get("allOf"), list) and nesting < 8:  # a cycle of allOf is cut
            part = _merged(part, m, nesting + 1)
        more, needed = part.get("properties"), part.get("required")
        if isinstance(more, dict) and m.spend(len(more)):
            properties.update(more)
        if isinstance(needed, list) and m.spend(len(needed)):
            fresh = [n for n in needed if isinstance(n, str) and n not in named]
            named.update(fresh)
            required += fresh
        for key, value in part.items():
            merged.setdefault(key, value)
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _is_null(schema: Any, m: _Making) -> bool:
    return isinstance(schema, dict) and _kind(m.once("resolved", schema, lambda: _resolved(schema, m)), m) == "null"


def _kind(schema: dict[str, Any], m: _Making) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        m.spend(len(kind))
        kind = next((k for k in kind if isinstance(k, str) and k.lower() != "null"), "null" if kind else None)
    if isinstance(kind, str) and kind.upper() != "TYPE_UNSPECIFIED":
        return kind.lower()
    if any(k in schema for k in ("properties", "required", "additionalProperties", "propertyOrdering")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _count(value: Any) -> float | None:
    """A numeric keyword, also as content generation sends its int64s (strings); None for one
    that is not a number, not finite, or past what a double holds exactly (`"inf"`, `1e400`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and len(value) <= 64:
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, int | float):
        return None
    try:
        return value if math.isfinite(value) and abs(value) <= _EXACT else None
    except OverflowError:  # an int too large for a float
        return None


def _object(schema: dict[str, Any], m: _Making, depth: int) -> Any:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    if not m.spend(len(properties) + len(required)) or not m.fits(2):
        return {} if m.work >= 0 or m.room >= 2 else _NOTHING
    needed = {n for n in required if isinstance(n, str)}
    names = list(properties) if depth < _FULL_DEPTH else [n for n in properties if n in needed]
    names += [n for n in needed if n not in properties]  # required, not described
    extra = schema.get("additionalProperties")
    made: dict[str, Any] = {}
    for name in names:
        optional = name not in needed
        if optional and m.room < _RESERVE:
            continue  # what is left is kept for what is required
        if not m.fits(len(name) + 4):  # quotes, colon, comma (a name with escapes is rare: near enough)
            break
        value = _value(properties.get(name, extra if isinstance(extra, dict) else {}), m, depth + 1, 0)
        if value is _NOTHING:
            if m.work < 0 or m.room <= 0:
                break
            continue
        made[name] = value
    return made


def _array(schema: dict[str, Any], m: _Making, depth: int) -> Any:
    prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
    items = schema.get("items")
    if isinstance(items, list):  # the older tuple form
        prefix, items = items, schema.get("additionalItems", {})
    least = int(_count(schema.get("minItems")) or 0)
    most = _count(schema.get("maxItems"))
    count = max(least, len(prefix), 1 if depth < _FULL_DEPTH else 0)
    if most is not None:
        count = min(count, int(most))
    if items is False:
        count = min(count, len(prefix))
    if not m.fits(2):
        return _NOTHING
    made: list[Any] = []
    for i in range(count):  # past the room or the work left, shorter than asked
        if i >= max(least, len(prefix)) and m.room < _RESERVE:
            break  # an item no keyword asks for
        value = _value(prefix[i] if i < len(prefix) else items if items is not None else {}, m, depth + 1, i)
        if value is _NOTHING:
            break
        made.append(value)
        m.room -= 1  # its comma
    return made


def _number(schema: dict[str, Any], kind: str, index: int) -> int | float:
    low, high = _count(schema.get("minimum")), _count(schema.get("maximum"))
    step = 1 if kind == "integer" else 0.5
    low_open, high_open = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low_open is True and low is not None:  # draft 4: a flag on minimum
        low += step
    elif (bound := _count(low_open)) is not None:
        low = bound + step if low is None else max(low, bound + step)
    if high_open is True and high is not None:
        high -= step
    elif (bound := _count(high_open)) is not None:
        high = bound - step if high is None else min(high, bound - step)
    value: float = 1 + min(index, 1_000_000)
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high if low is None or high >= low else low
    multiple = _count(schema.get("multipleOf"))
    # A step so fine the value would hold past 2**53 of them (1e-320) is no step: left out.
    if multiple and abs(value / multiple) <= _EXACT:
        value = math.ceil(value / multiple) * multiple
        if high is not None and value > high:
            value = math.floor(high / multiple) * multiple
    if kind == "integer":
        return int(math.ceil(value)) if low is not None and value == low else int(value)
    return float(value)


def _string(schema: dict[str, Any], index: int, m: _Making) -> str:
    fmt = schema.get("format")
    candidates = ([_FORMATS[fmt]] if isinstance(fmt, str) and fmt in _FORMATS else []) + list(_STRINGS)
    if index:
        candidates.insert(1 if candidates[0] != "simulated" else 0, f"simulated {index + 1}")
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and m.spend(1 + len(pattern) // 16):
        try:
            # The caller's pattern, run with a time bound (`regex`, not `re`): a nested repeat such
            # as `(.*)*Z` backtracks for ever on a 36-character candidate, and held the loop.
            matcher = regex.compile(pattern)
            matching = []
            for candidate in candidates:
                if m.pattern_s <= 0:
                    break
                began = time.perf_counter()
                try:
                    if matcher.search(candidate, timeout=m.pattern_s):
                        matching.append(candidate)
                finally:
                    m.pattern_s -= time.perf_counter() - began
            candidates = matching or candidates
        except (regex.error, RecursionError, OverflowError, TimeoutError):
            pass
    text = candidates[0]
    least, most = _count(schema.get("minLength")), _count(schema.get("maxLength"))
    if least is not None and len(text) < least:
        text += "x" * (min(int(least), _LONGEST, max(m.room - 2, 0)) - len(text))
    if most is not None and len(text) > most:
        text = text[: max(int(most), 0)]
    return text
