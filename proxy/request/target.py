"""The request target the gateway sends upstream: built from the route's template, never copied.

A client's target is hostile until it is taken apart and checked. Only origin-form targets
are accepted (`/path?query`): absolute-form (`http://host/path`) would steer a virtual-hosted
upstream, and a `#fragment` has no place on the wire. Each path parameter is decoded once
(aiohttp's router does that) and must then match its grammar below: one clean segment, no
`/`, `%`, `?`, `#`, dot segments, whitespace or control characters. The upstream path is the
route's template with those values re-quoted, so what was checked is exactly what is sent.
The query is rebuilt from its decoded pairs; pairs that carry a client key go no further.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_to_bytes

# What each path parameter may hold (docs/security.md lists them). The first character is a
# letter or digit, so neither "." nor ".." can be a value.
PARAM_GRAMMAR: dict[str, tuple[re.Pattern[str], str]] = {
    "model": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+=-]{0,255}"),
        "1-256 letters, digits or . _ - @ + =, starting with a letter or digit",
    ),
    "task_id": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._~:@+=-]{0,511}"),
        "1-512 letters, digits or . _ ~ : @ + = -, starting with a letter or digit",
    ),
    "response_id": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._~:@+=-]{0,511}"),
        "1-512 letters, digits or . _ ~ : @ + = -, starting with a letter or digit",
    ),
    "provider": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"),
        "1-64 letters, digits, _ or -, starting with a letter or digit",
    ),
}
# Query parameter names that carry a client's key to the gateway (compared decoded, in any case).
KEY_PARAMS = frozenset({"key"})
# Left as they are when a query value is encoded again: legal in a query (RFC 3986 3.4) and read
# the same by every server. `;` (an old separator), `&`, `=`, `+` and `#` are always encoded.
_QUERY_SAFE = ",:@/!$'()*~"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TEMPLATE_PARAM = re.compile(r"\{([^}]+)\}")


class TargetError(Exception):
    """A request target the gateway will not build on: always a 400 in the endpoint's shape."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class Target:
    """A checked target: the route's template, its decoded parameters and query pairs."""

    template: str
    params: dict[str, str]
    query: list[tuple[str, str | None]] = field(default_factory=list)  # without client-key pairs; None: no `=`
    keys: list[tuple[str, str]] = field(default_factory=list)  # the client-key pairs taken out

    def key_values(self) -> list[str]:
        """The values of the `key` parameters (exactly that name, once decoded), empty ones left out."""
        return [value for name, value in self.keys if name == "key" and value]

    def path(self, **overrides: str) -> str:
        """The template with each parameter re-quoted; `overrides` replace values (a renamed model)."""
        if not self.params:
            return self.template
        values = {**self.params, **overrides}
        return _TEMPLATE_PARAM.sub(lambda m: quote(values[m[1]], safe="@+=:~"), self.template)

    def query_string(self, extra: tuple[tuple[str, str], ...] = ()) -> str:
        if not self.query and not extra:
            return ""
        # surrogateescape: a keyless route's undecodable `key` pair goes on as the bytes it came as
        return "&".join(
            quote(name, safe=_QUERY_SAFE)
            if value is None
            else f"{quote(name, safe=_QUERY_SAFE)}={quote(value, safe=_QUERY_SAFE, errors='surrogateescape')}"
            for name, value in [*self.query, *extra]
        )


def build_target(raw_target: str, template: str, params: dict[str, str]) -> Target:
    """Check a client's request target against its route; raise TargetError when it cannot be used."""
    if raw_target == template:  # the common case: a path without parameters, query or fragment
        return Target(template, params, [], [])
    if not raw_target.startswith("/") or raw_target.startswith("//"):
        raise TargetError("the request target must be a path (origin-form), not an absolute URL")
    if "#" in raw_target:
        raise TargetError("the request target must not carry a #fragment")
    for name, value in params.items():
        grammar, described = PARAM_GRAMMAR[name]
        if grammar.fullmatch(value) is None:
            raise TargetError(f"path parameter '{name}' must be {described}", param=name)
    query, keys = parse_query(raw_target.partition("?")[2])
    return Target(template, params, query, keys)


def parse_query(raw: str) -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
    """Decoded pairs (`+` is a space, as in forms; a bare name has the value None), and apart
    from them the client-key pairs. A pair that does not decode to UTF-8, or that holds a control
    character, is refused."""
    pairs: list[tuple[str, str | None]] = []
    keys: list[tuple[str, str]] = []
    if not raw:
        return pairs, keys
    for item in raw.split("&"):
        if not item:
            continue
        raw_name, equals, raw_value = item.partition("=")
        name = _decode(raw_name)
        # A key that is not UTF-8 is kept undecodable: no key matches it, so it is a 401.
        is_key = name.lower() in KEY_PARAMS
        value = _decode(raw_value, "surrogateescape" if is_key else "strict") if equals else None
        if _CONTROL.search(name) or value is not None and _CONTROL.search(value):
            raise TargetError("a query parameter holds a control character")
        if is_key:
            keys.append((name, value or ""))
        else:
            pairs.append((name, value))
    return pairs, keys


def _decode(text: str, errors: str = "strict") -> str:
    try:
        return unquote_to_bytes(text.replace("+", " ")).decode("utf-8", errors)
    except UnicodeDecodeError:
        raise TargetError("the query string is not valid UTF-8 once decoded") from None
