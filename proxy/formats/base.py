"""What every wire format knows about itself: where its key lives, how its errors and usage look."""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core import jsonutil
from proxy.core.usage import Generation, Usage
from proxy.formats.counts import at, count, largest_limit

if TYPE_CHECKING:
    from proxy.wire.sse import SSEEvent

# Every header a client may have put a key in: on keyed routes all are removed before a request
# goes upstream, whichever the route reads, so a key sent in the "wrong" place never leaks either.
# (`api-key` is where some SDKs put it; query `key` pairs are taken apart in proxy.request.target.)
CLIENT_KEY_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")
CLIENT_KEY_QUERY = "key"


class KeyLocation(enum.Enum):
    """Where a format carries its API key: the spec's place (section 5), or where an official SDK
    of the format puts it instead."""

    BEARER = "authorization"
    X_API_KEY = "x-api-key"
    QUERY = "key"
    GOOG_API_KEY = "x-goog-api-key"
    NONE = "none"

    @property
    def described(self) -> str:
        return _DESCRIBED[self]


_DESCRIBED = {
    KeyLocation.BEARER: "an 'Authorization: Bearer <key>' header",
    KeyLocation.X_API_KEY: "an 'x-api-key' header",
    KeyLocation.QUERY: "the 'key' query parameter",
    KeyLocation.GOOG_API_KEY: "an 'x-goog-api-key' header",
    KeyLocation.NONE: "nowhere",
}


@dataclass(slots=True)
class EmbeddedImage:
    """A Base64 image in an answer, and how to put a URL where it was (in the format's own words)."""

    data: str
    place: Callable[[str, str], None]  # (url, media type)


def items(mapping: Any, name: str) -> list[Any]:
    """The list a field of an answer holds; an upstream's answer is input like any other, so a
    field of another shape (a number, an object) is no list, not a crash."""
    value = mapping.get(name) if isinstance(mapping, dict) else None
    return value if isinstance(value, list) else []


class Format:
    """One wire format of the spec. Subclasses are stateless singletons."""

    name: ClassVar[str]
    key_location: ClassVar[KeyLocation]
    # Where the format's official SDK sends the key when that is not the spec's place: read too,
    # unless the operator asks for the spec's reading only (`server.strict_interface`).
    sdk_key_locations: ClassVar[tuple[KeyLocation, ...]] = ()
    json_content_type: ClassVar[str] = "application/json"
    reports_usage: ClassVar[bool] = False  # its answers and stream events say how many tokens they cost

    # Where an answer of this format names the id it creates (a task, a response), in order.
    id_fields: ClassVar[tuple[str, ...]] = ("id",)
    # The field (as JSON and proto paths) this format's upstream reads for the most output an
    # answer may make; none: the format makes no tokens, or has no such field.
    output_field: ClassVar[tuple[tuple[str, ...], ...]] = ()
    # What a request of this format asks for less of, to fit a budget (its refusals say so).
    asking_less: ClassVar[str] = "less"
    # Body names (quoted, as bytes) a stream's charge goes by where the format has such: given
    # twice, the body goes upstream re-encoded as parsed (proxy/request/deciding_fields.py). Only
    # such formats pay the scans, a large body's hundred microseconds.
    charged_by: ClassVar[tuple[bytes, ...]] = ()

    def created_id_event(self, event: SSEEvent) -> tuple[bool, Any]:
        """Whether this stream event is the one naming the id the answer creates, and that id."""
        return False, None

    def followed_in_body(self, body: Any) -> str | None:
        """The id of an earlier answer a request body follows (None: it follows none)."""
        return None

    def asks_for_image_urls(self, body: Any) -> bool:
        """Whether a request body asks for images as temporary URLs rather than Base64."""
        return False

    def without_delivery_fields(self, body: Any) -> Any:
        """The request body without the fields that ask for URLs, where those are no field of the
        upstream's (None: it has none to remove)."""
        return None

    def embedded_images(self, answer: Any) -> list[EmbeddedImage]:
        """The Base64 images of a (parsed) answer, each with its place."""
        return []

    def betas(self, headers: CIMultiDictProxy[str]) -> str:
        """The beta features a request asks for, comma-separated ('' for a format without them)."""
        return ""

    def missing_version(self, headers: Mapping[str, str], strict: bool) -> tuple[str, str] | None:
        """The version header a request of this format lacks and what to tell the client, or
        None: only the message format asks for one."""
        return None

    def key_locations(self, strict: bool) -> tuple[KeyLocation, ...]:
        """The places a key is read from: the spec's first."""
        return (self.key_location,) if strict else (self.key_location, *self.sdk_key_locations)

    def client_keys(
        self, headers: CIMultiDictProxy[str] | CIMultiDict[str], query_keys: list[str], strict: bool = False
    ) -> list[str]:
        """The different keys the client sent, every copy in every place this format reads (one,
        normally; none, or two that differ, say the request names no single key); `query_keys`
        are the decoded values of its `key` query pairs."""
        found: list[str] = []
        for location in self.key_locations(strict):
            for key in _read_keys(location, headers, query_keys):
                if key not in found:
                    found.append(key)
        return found

    def client_key(
        self, headers: CIMultiDictProxy[str] | CIMultiDict[str], query_keys: list[str], strict: bool = False
    ) -> str | None:
        """The one key the client sent, or None (none sent, or two different ones)."""
        keys = self.client_keys(headers, query_keys, strict)
        return keys[0] if len(keys) == 1 else None

    def strip_client_key(self, headers: CIMultiDict[str], is_gateway_key: Callable[[str], bool]) -> None:
        """Remove every header a client key may travel in. A keyed format removes them all; a
        keyless one (the account routes) removes only those holding one of the gateway's keys,
        since anything else there is the account backend's own (a session token, say)."""
        keyed = self.key_location is not KeyLocation.NONE
        for name in CLIENT_KEY_HEADERS:
            if name not in headers:
                continue
            if keyed:
                del headers[name]
                continue
            kept = [value for value in headers.getall(name) if not holds_key(value, is_gateway_key)]
            headers.popall(name, None)
            for value in kept:
                headers.add(name, value)

    def keeps_query_key(self, value: str, is_gateway_key: Callable[[str], bool]) -> bool:
        """Whether a client's `key` query pair goes upstream: never on a keyed route; on a
        keyless one unless it is one of the gateway's keys."""
        return self.key_location is KeyLocation.NONE and not holds_key(value, is_gateway_key)

    def place_credential(self, credential: str | None, headers: CIMultiDict[str]) -> None:
        """Put the channel's credential in this format's header (the query key: `credential_query`),
        in place of whatever an earlier attempt put there: a channel failed over from must not
        hand its credential to the next one. (The client's key headers are gone by then:
        strip_client_key; only this format's own header can hold an earlier credential.)"""
        location = self.key_location
        if location is KeyLocation.BEARER:
            name, value = "Authorization", f"Bearer {credential}"
        elif location is KeyLocation.X_API_KEY:
            name, value = "x-api-key", credential or ""
        else:
            return
        if credential is not None:
            headers[name] = value
        elif name in headers:
            del headers[name]

    def place_version(self, headers: CIMultiDict[str], name: str | None, sent: CIMultiDictProxy[str]) -> None:
        """Put the client's API version (from the headers it `sent`) in the header a channel asks
        for; only the message format has one."""

    def versioned_path(self, path: str, version: str | None) -> str:
        """The upstream path with the API version a channel asks for; only content generation
        has versions in its paths."""
        return path

    def credential_query(self, credential: str | None) -> tuple[tuple[str, str], ...]:
        """The query pair carrying the channel's credential, for formats that carry it there."""
        if credential is not None and self.key_location is KeyLocation.QUERY:
            return ((CLIENT_KEY_QUERY, credential),)
        return ()

    def shape_for(self, headers: CIMultiDictProxy[str], query_keys: list[str]) -> Format:
        """The format a local answer of this format's route is shaped in: its own."""
        return self

    def model_entry(self, model: str) -> dict[str, Any]:
        """One model as `GET .../models/{model}` answers it in this format: the response SDK's object."""
        return {"id": model, "object": "model", "created": 0, "owned_by": "modelgate"}

    def model_list(self, models: list[str]) -> dict[str, Any]:
        """`GET .../models` in this format's shape."""
        return {"object": "list", "data": [self.model_entry(m) for m in models]}

    def error_payload(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        """The images / response / video shape (the spec shows none; see docs/errors.md)."""
        return {"error": {"message": message, "type": generic_error_type(status), "param": param, "code": code}}

    def error_response(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> web.Response:
        return web.Response(
            status=status,
            body=jsonutil.dumps(self.error_payload(status, message, code, param)),
            content_type="application/json",
            headers=headers,
        )

    def usage_from_body(self, body: Any) -> Usage | None:
        """Usage as the message, response and images formats report it: `usage.input_tokens` and
        `usage.output_tokens`. Formats that report it otherwise override this."""
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        return Usage(
            token_count(usage, "input_tokens"),
            token_count(usage, "output_tokens"),
            token_count(usage.get("input_tokens_details"), "cached_tokens"),
            token_count(usage.get("output_tokens_details"), "reasoning_tokens"),
            final=True,
        )

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        return None

    def with_stream_usage(self, body: Any) -> Any:
        """The body of a streamed request that would not be told its usage, asking for it (None:
        nothing to change; only the chat-completions format reports usage on request alone)."""
        return None

    def finished_choices(self, event: SSEEvent, body: Any) -> tuple[int, ...]:
        """The answers (choices) a stream event says are finished, where a format tells that
        apart from its closing counts and the request (`body`, as sent) asks for them (chat
        completions); () for the others, whose closing counts come with their finish."""
        return ()

    def unasked_usage(self, event: SSEEvent) -> bool:
        """Whether a stream event answers only what `with_stream_usage` asked for (kept from the client)."""
        return False

    def response_id_of(self, answer: Any) -> str | None:
        """The id the upstream gave its answer (a trace's gen_ai.response.id), from a JSON answer
        or a stream's opening event, which wraps the answer (`message`, `response`)."""
        if not isinstance(answer, dict):
            return None
        found = answer.get("id")
        if found is None:
            inner = answer.get("message") or answer.get("response")
            found = inner.get("id") if isinstance(inner, dict) else None
        return found if isinstance(found, str) else None

    def in_background(self, body: Any) -> bool:
        """Whether a request asks for a generation that goes on after its answer (and after its
        client leaves), to be read later: only the response format has them."""
        return False

    def generation_of(self, answer: Any) -> Generation | None:
        """What a (parsed) answer tells of the generation it made or follows, when this format
        has generations that outlive an answer; None otherwise."""
        return None

    def generation_in_event(self, event: SSEEvent) -> Generation | None:
        """The same, from a stream event (its last, normally)."""
        return None

    def output_limit(self, body: Any, default: int) -> int:
        """The most output the upstream may make for one answer of this request: the field this
        format's upstream reads (`output_field`), else `default` (the upstream's own default when
        the request names none). Any other spelling the request also carries (another format's
        field, which this upstream may read too, or ignore) can only raise it: a decoy
        `max_tokens: 1` beside `max_output_tokens: 40000` never shrinks a reservation."""
        if not isinstance(body, dict):
            return default
        own = None
        for path in self.output_field:
            if (value := at(body, path)) is not None and (own := count(value)):
                break
        return max(own or default, largest_limit(body))

    def outputs(self, body: Any) -> int:
        """How many answers (candidates, images, videos) one request asks the upstream for, each
        up to `output_limit`."""
        return 1

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        """An SSE event that tells a streaming client the stream failed, in this format's words."""
        payload = {"type": "error", **self.error_payload(status, message, code)}
        return b"event: error\ndata: " + jsonutil.dumps(payload) + b"\n\n"


def _read_keys(
    location: KeyLocation, headers: CIMultiDictProxy[str] | CIMultiDict[str], query_keys: list[str]
) -> list[str]:
    """Every non-empty key value in one place (a header or query name given twice gives two)."""
    if location is KeyLocation.QUERY:
        return [key for key in query_keys if key]
    if location is KeyLocation.NONE:
        return []
    values = headers.getall(location.value, [])
    if location is KeyLocation.BEARER:
        tokens = []
        for value in values:
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                tokens.append(token.strip())
        return tokens
    return [value for value in values if value]


def generic_error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def token_count(mapping: Any, key: str) -> int | None:
    """A token count an upstream reported: a whole number from 0 up to 2**53 (what a metric holds
    exactly); anything else is no count at all, never an error."""
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53:
        return value
    return None


_TOKEN_SEPARATORS = re.compile(r"[\s,;\"']+")


def holds_key(value: str, is_gateway_key: Callable[[str], bool]) -> bool:
    """Whether any word of a header or query value (split at white space, commas, semicolons and
    quotes, so a scheme word like `Bearer`, a list, quoting or padding hides nothing), or either
    half of a Basic credential, is a gateway key."""
    for token in _TOKEN_SEPARATORS.split(value):
        if token and (is_gateway_key(token) or any(is_gateway_key(part) for part in _basic(token))):
            return True
    return False


def _basic(token: str) -> list[str]:
    """The user and password of a Basic credential (`base64(user:password)`), if the token is one."""
    try:
        user, sep, password = base64.b64decode(token, validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return []
    return [user, password] if sep else []
