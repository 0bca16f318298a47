"""A JSON value that validates against a schema: the arguments of a simulated tool call and the
text of a simulated structured answer.

Takes plain JSON Schema (tools' `input_schema`, `parameters`, `parametersJsonSchema`,
`text.format.schema`, `responseJsonSchema`: what pydantic emits, with `$defs`, `$ref`, `anyOf`)
and the OpenAPI subset content generation calls `Schema` (upper-case types, `nullable`, numbers
sent as strings). Every property is filled near the top, only required ones deeper down, so a
recursive schema still ends; a value the schema cannot have (`false`, a pattern no candidate
matches) is the closest one it can make, since the schema is the caller's and may be anything.
"""

from __future__ import annotations

import math
import re
from typing import Any

_FULL_DEPTH = 6     # every property filled down to here, only the required ones below
_GIVE_UP = 32       # a schema that requires itself forever gets a null at this depth
_VALUES = 10_000    # values one answer may hold (a string of 16 characters counts as one more)
_LONGEST = 16_384   # characters one string may hold
_STRINGS = ("simulated", "a", "A", "0", "abc", "a-b", "a_b", "A1", "x@example.com")
_CAMEL = {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): k for k in (
    "anyOf", "oneOf", "allOf", "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "prefixItems", "additionalProperties",
    "additionalItems", "propertyOrdering")}
_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z", "date": "2025-01-01", "time": "12:00:00Z", "duration": "P1D",
    "email": "sim@example.com", "idn-email": "sim@example.com", "hostname": "example.com",
    "idn-hostname": "example.com", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1", "uri": "https://example.com/sim",
    "iri": "https://example.com/sim", "uri-reference": "/sim", "iri-reference": "/sim",
    "url": "https://example.com/sim", "uuid": "00000000-0000-4000-8000-000000000000",
    "json-pointer": "/sim", "relative-json-pointer": "0", "regex": "^sim$", "byte": "c2ltdWxhdGVk",
}


def value_for(schema: Any) -> Any:
    """A value `schema` accepts (or the closest one this makes: see the module's doc)."""
    return _value(schema, schema, 0, 0, [_VALUES])


def _value(schema: Any, root: Any, depth: int, index: int, budget: list[int]) -> Any:
    """`root` resolves `$ref`s, `index` varies the items of one array, `budget` is how many more
    values may be made (a hostile schema asks for billions of items, or nests arrays deep)."""
    budget[0] -= 1
    if schema is False or depth > _GIVE_UP or budget[0] < 0:
        return None
    if not isinstance(schema, dict):
        return "simulated"
    schema = _resolved(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        choices = [v for v in schema["enum"] if v is not None] or schema["enum"]
        return choices[index % len(choices)]
    # Combinators count as a level: a `$ref` cycle through them ends at _GIVE_UP too.
    if isinstance(schema.get("allOf"), list):
        return _value(_merged(schema, root), root, depth + 1, index, budget)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            rest = {k: v for k, v in schema.items() if k != key}
            branch = next((b for b in branches if not _is_null(b, root)), branches[0])
            return _value({**rest, **_resolved(branch, root)} if isinstance(branch, dict) else branch,
                          root, depth + 1, index, budget)
    kind = _kind(schema)
    if kind == "null":
        return None
    if kind == "object":
        return _object(schema, root, depth, budget)
    if kind == "array":
        return _array(schema, root, depth, budget)
    if kind in ("integer", "number"):
        return _number(schema, kind, index)
    if kind == "boolean":
        return True
    text = _string(schema, index)
    budget[0] -= len(text) // 16  # long strings spend the budget too
    return text


def _resolved(schema: dict[str, Any], root: Any) -> dict[str, Any]:
    """`$ref` followed (a local JSON pointer, as `#/$defs/Name`), its siblings kept; a few hops at
    most; keywords in snake case (as google-genai sends some: `min_items`) in camel case."""
    schema = _camel(schema)
    for _ in range(8):
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            return schema
        target: Any = root
        if ref != "#":
            if not ref.startswith("#/"):
                return {k: v for k, v in schema.items() if k != "$ref"}  # remote: not fetched
            for token in ref[2:].split("/"):
                token = token.replace("~1", "/").replace("~0", "~")
                target = target.get(token) if isinstance(target, dict) else None
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**_camel(target), **siblings} if isinstance(target, dict) else siblings
    return schema


def _camel(schema: dict[str, Any]) -> dict[str, Any]:
    if not any("_" in key for key in schema):
        return schema
    return {_CAMEL.get(key, key): value for key, value in schema.items()}


def _merged(schema: dict[str, Any], root: Any, nesting: int = 0) -> dict[str, Any]:
    """`allOf` as one schema: properties and required lists joined, other keys first come first kept."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties = dict(merged.get("properties") or {})
    required = list(merged.get("required") or [])
    for part in schema["allOf"]:
        if not isinstance(part, dict):
            continue
        part = _resolved(part, root)
        if isinstance(part.get("allOf"), list) and nesting < 8:  # a cycle of allOf is cut
            part = _merged(part, root, nesting + 1)
        properties.update(part.get("properties") or {})
        required += [name for name in part.get("required") or [] if name not in required]
        for key, value in part.items():
            merged.setdefault(key, value)
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _is_null(schema: Any, root: Any) -> bool:
    return isinstance(schema, dict) and _kind(_resolved(schema, root)) == "null"


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
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
    """A numeric keyword, also as content generation sends its int64s (strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _object(schema: dict[str, Any], root: Any, depth: int, budget: list[int]) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [n for n in schema.get("required") or [] if isinstance(n, str)]
    names = list(properties) if depth < _FULL_DEPTH else [n for n in properties if n in required]
    names += [n for n in required if n not in names]
    extra = schema.get("additionalProperties")
    return {name: _value(properties.get(name, extra if isinstance(extra, dict) else {}), root, depth + 1, 0, budget)
            for name in names if budget[0] > 0}


def _array(schema: dict[str, Any], root: Any, depth: int, budget: list[int]) -> list[Any]:
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
    count = min(count, max(0, budget[0]))
    return [_value(prefix[i] if i < len(prefix) else items if items is not None else {}, root, depth + 1, i, budget)
            for i in range(count)]


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
    value: float = 1 + index
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high if low is None or high >= low else low
    multiple = _count(schema.get("multipleOf"))
    if multiple:
        value = math.ceil(value / multiple) * multiple
        if high is not None and value > high:
            value = math.floor(high / multiple) * multiple
    if kind == "integer":
        return int(math.ceil(value)) if low is not None and value == low else int(value)
    return float(value)


def _string(schema: dict[str, Any], index: int) -> str:
    fmt = schema.get("format")
    candidates = ([_FORMATS[fmt]] if isinstance(fmt, str) and fmt in _FORMATS else []) + list(_STRINGS)
    if index:
        candidates.insert(1 if candidates[0] != "simulated" else 0, f"simulated {index + 1}")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            matcher = re.compile(pattern)
            candidates = [c for c in candidates if matcher.search(c)] or candidates
        except re.error:
            pass
    text = candidates[0]
    least, most = _count(schema.get("minLength")), _count(schema.get("maxLength"))
    if least is not None and len(text) < least:
        text += "x" * (min(int(least), _LONGEST) - len(text))
    if most is not None and len(text) > most:
        text = text[: int(most)]
    return text
