"""What a client gets for a request aiohttp's parser refuses: a JSON error, never its own bytes.

aiohttp answers a request it cannot parse (a header line past the parser's fence, a control
character in a header, a request line that is no HTTP) itself, before any handler runs, in
plain text that quotes the offending bytes: a Bearer key, a `?key=`, whatever a client (or an
attacker reflecting into a client's page) sent. Here that answer is the generic error shape of
docs/errors.md instead, without a byte of the request: 431 for a line or a header count past
the fence (the gateway's own header budget answers 431 too, proxy/request/client_guards.py),
400 for the rest. The endpoint is not known yet, so the shape is the one the images, response,
video and account endpoints use. What aiohttp logs of it is kept to the exception's kind
(proxy/process/log_guard.py).

An `Expect` other than `100-continue` is refused the same way: aiohttp's 417 is plain text
that repeats the header's value (a page reflecting into a client could put a script and a
key there); here it is a JSON 417 `expectation_failed` that repeats nothing. Both listeners,
the clients' and the admin one, are made to answer so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from proxy.formats import ACCOUNT
from proxy.observability.metrics import MALFORMED_REQUESTS, child

# Why a request was refused, by the parser's exception (the most specific first); never its text.
_WHY = (
    (BadHttpMethod, "the request method is not a valid token"),
    (BadStatusLine, "the request line is not 'METHOD target HTTP/1.x'"),
    (InvalidURLError, "the request target is malformed"),
    (InvalidHeader, "a request header is malformed"),
    (PayloadEncodingError, "the request body's framing (Content-Length, Transfer-Encoding, chunks) is malformed"),
)


class RefusingHandler(RequestHandler):
    """aiohttp's connection handler, answering what its parser refuses in JSON."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> StreamResponse:
        if isinstance(exc, HttpProcessingError):  # counted here, whatever of it the log guard lets through
            child(MALFORMED_REQUESTS, type(exc).__name__).inc()
        # aiohttp's own call logs it (through the log guard) and raises when an answer has begun.
        super().handle_error(request, status, exc, "")
        answer = refusal(status, exc, self.max_field_size)
        answer.force_close()
        return answer


def refusal(status: int, exc: BaseException | None, max_line: int) -> web.Response:
    """The answer to a request refused before any endpoint was known."""
    if isinstance(exc, LineTooLong):
        return ACCOUNT.error_response(
            431, f"the request line or a header line is over {max_line // 1024} KB", "request_header_fields_too_large"
        )
    if isinstance(exc, BadHttpMessage) and exc.message.startswith("Too many headers"):
        return ACCOUNT.error_response(431, "too many request header lines", "request_header_fields_too_large")
    if status == 400 or isinstance(exc, BadHttpMessage):
        why = next(
            (why for kind, why in _WHY if isinstance(exc, kind)),
            "the request is not well-formed HTTP/1.1 (a control character in a header, a header that may "
            "come once given twice, ...)",
        )
        return ACCOUNT.error_response(
            400, f"{why}; it was refused, and its bytes are not repeated here", "malformed_request"
        )
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return ACCOUNT.error_response(status, f"the gateway could not answer this request ({phrase})")


class RefusingServer(web.Server):
    """aiohttp's server, making `RefusingHandler`s."""

    def __call__(self) -> RequestHandler:
        return RefusingHandler(self, loop=self._loop, **self._kwargs)


def expectation_failed() -> web.Response:
    answer = ACCOUNT.error_response(
        417,
        "the Expect header asks for something the gateway does not do (it knows 100-continue alone); "
        "its value is not repeated here",
        "expectation_failed",
    )
    answer.force_close()  # a body may follow that the client was to hold back: none of it is read as a request
    return answer


def _expectations_in_json(
    handle: Callable[[BaseRequest], Awaitable[StreamResponse]],
) -> Callable[[BaseRequest], Awaitable[StreamResponse]]:
    """The application's handler, with aiohttp's refusal of an `Expect` (raised by the default
    expect handler every route has, before the route's own handler runs) answered in JSON. The
    application keeps deciding: `100-continue` still gets its interim answer there."""

    async def handled(request: BaseRequest) -> StreamResponse:
        try:
            return await handle(request)
        except web.HTTPExpectationFailed:
            return expectation_failed()

    return handled


def refuse_in_json(server: web.Server) -> None:
    """Make the app runner's server answer refused requests in JSON. aiohttp builds that server
    inside its runner and names its handler class there, so the class is swapped after setup:
    both add only behaviour, no state. The connection handlers it makes read the (wrapped)
    request handler when they are made, so this comes before the runner's site starts."""
    server.__class__ = RefusingServer
    server.request_handler = _expectations_in_json(server.request_handler)
