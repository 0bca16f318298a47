"""The 13 endpoints of the spec, chat completions beside them, and the calls SDKs make around
them, as data: method, path, format, where the model and body come from.

The pipeline of each route comes from config or the plugins' defaults; everything else about a route is fixed here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from proxy.formats import ACCOUNT, CHAT, CONTENT, IMAGES, MESSAGES, MODELS, RESPONSES, VIDEO, Format
from proxy.formats.base import KeyLocation


class Body(enum.Enum):
    """What a route's request body is, which decides how the gateway reads it."""

    NONE = "none"  # GET: nothing to read
    JSON = "json"  # read whole (bounded), parsed once, forwarded as sent
    JSON_OR_MULTIPART = "json_or_multipart"  # multipart streams through while observed
    RAW = "raw"  # opaque bytes, forwarded byte-exact (webhooks)


class ModelFrom(enum.Enum):
    BODY = "body"
    PATH = "path"
    NONE = "none"


class Pin(enum.Enum):
    """Stateful ids that must lead back to the channel that made them."""

    VIDEO_TASK = "video"
    RESPONSE = "response"


@dataclass(slots=True, frozen=True)
class Route:
    name: str
    number: int
    method: str
    path: str
    format: Format
    body: Body
    model_from: ModelFrom
    creates: Pin | None = None  # the answer carries a new id to remember
    follows: Pin | None = None  # the request names an id made earlier
    always_streams: bool = False
    streams_bytes: bool = False  # large binary answer: never buffered
    local: bool = False  # answered by the gateway itself, after the pipeline (no channel)
    # Its answers are charged (tokens, images, video seconds): budgets and token limits reserve for
    # it. A route that reads what another request made (a status poll, a download, a stored
    # response) is never charged: it may settle that request's charge instead.
    spends_tokens: bool = True
    # A body limit of its own, below the server's, unless `routes.<route>.max_body_mb` says otherwise:
    # for a route anyone may post to without a key whose bodies are small by nature.
    max_body_mb: float | None = None

    @property
    def metered(self) -> bool:
        """Whether what a generation costs is learnt here: on an endpoint, and on a call that reads
        what one made (a stored response, its cancel), which may settle a charge left open."""
        return self.number > 0 or self.follows is not None

    @property
    def takes_key(self) -> bool:
        """Whether a gateway key is read on this route (the account routes take none)."""
        return self.format.key_location is not KeyLocation.NONE


ROUTES: tuple[Route, ...] = (
    Route(
        "video_generations",
        1,
        "POST",
        "/v1/video/generations",
        VIDEO,
        Body.JSON,
        ModelFrom.BODY,
        creates=Pin.VIDEO_TASK,
    ),
    Route(
        "video_generation_status",
        2,
        "GET",
        "/v1/video/generations/{task_id}",
        VIDEO,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.VIDEO_TASK,
        spends_tokens=False,
    ),
    Route("videos", 3, "POST", "/v1/videos", VIDEO, Body.JSON_OR_MULTIPART, ModelFrom.BODY, creates=Pin.VIDEO_TASK),
    Route(
        "video_status",
        4,
        "GET",
        "/v1/videos/{task_id}",
        VIDEO,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.VIDEO_TASK,
        spends_tokens=False,
    ),
    Route(
        "video_content",
        5,
        "GET",
        "/v1/videos/{task_id}/content",
        VIDEO,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.VIDEO_TASK,
        streams_bytes=True,
        spends_tokens=False,
    ),
    Route("image_generations", 6, "POST", "/v1/images/generations", IMAGES, Body.JSON, ModelFrom.BODY),
    Route("image_edits", 7, "POST", "/v1/images/edits", IMAGES, Body.JSON_OR_MULTIPART, ModelFrom.BODY),
    Route("messages", 8, "POST", "/v1/messages", MESSAGES, Body.JSON, ModelFrom.BODY),
    Route("generate_content", 9, "POST", "/v1beta/models/{model}:generateContent", CONTENT, Body.JSON, ModelFrom.PATH),
    Route(
        "stream_generate_content",
        10,
        "POST",
        "/v1beta/models/{model}:streamGenerateContent",
        CONTENT,
        Body.JSON,
        ModelFrom.PATH,
        always_streams=True,
    ),
    Route(
        "responses",
        11,
        "POST",
        "/v1/responses",
        RESPONSES,
        Body.JSON,
        ModelFrom.BODY,
        creates=Pin.RESPONSE,
        follows=Pin.RESPONSE,
    ),
    Route("login_2fa", 12, "POST", "/api/user/login/2fa", ACCOUNT, Body.RAW, ModelFrom.NONE),
    # Payment callbacks are a few KB; the queue keeps them in the shared Redis.
    Route("payment_webhook", 13, "POST", "/api/{provider}/webhook", ACCOUNT, Body.RAW, ModelFrom.NONE, max_body_mb=1.0),
    # Beside the interface's 13: the chat-completions format, the one most clients speak; keyed,
    # validated, metered, limited and budgeted like them (number 14: an endpoint like them).
    Route("chat_completions", 14, "POST", "/v1/chat/completions", CHAT, Body.JSON, ModelFrom.BODY),
    # The calls an official SDK makes around the 13 (number 0: not in the interface), each with its
    # format's key places, and pinned to the channel that made the object it names.
    Route(
        "count_tokens", 0, "POST", "/v1/messages/count_tokens", MESSAGES, Body.JSON, ModelFrom.BODY, spends_tokens=False
    ),
    Route(
        "count_content_tokens",
        0,
        "POST",
        "/v1beta/models/{model}:countTokens",
        CONTENT,
        Body.JSON,
        ModelFrom.PATH,
        spends_tokens=False,
    ),
    Route(
        "response_retrieve",
        0,
        "GET",
        "/v1/responses/{response_id}",
        RESPONSES,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.RESPONSE,
        spends_tokens=False,
    ),
    Route(
        "response_delete",
        0,
        "DELETE",
        "/v1/responses/{response_id}",
        RESPONSES,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.RESPONSE,
        spends_tokens=False,
    ),
    Route(
        "response_input_items",
        0,
        "GET",
        "/v1/responses/{response_id}/input_items",
        RESPONSES,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.RESPONSE,
        spends_tokens=False,
    ),
    Route(
        "response_cancel",
        0,
        "POST",
        "/v1/responses/{response_id}/cancel",
        RESPONSES,
        Body.NONE,
        ModelFrom.NONE,
        follows=Pin.RESPONSE,
        spends_tokens=False,
    ),
    Route("video_list", 0, "GET", "/v1/videos", VIDEO, Body.NONE, ModelFrom.NONE, local=True, spends_tokens=False),
    Route("models", 0, "GET", "/v1/models", MODELS, Body.NONE, ModelFrom.NONE, local=True, spends_tokens=False),
    Route(
        "content_models",
        0,
        "GET",
        "/v1beta/models",
        CONTENT,
        Body.NONE,
        ModelFrom.NONE,
        local=True,
        spends_tokens=False,
    ),
    # one model (its name in the path, not a model the request uses: auth checks no model rule)
    Route(
        "model_retrieve",
        0,
        "GET",
        "/v1/models/{model}",
        MODELS,
        Body.NONE,
        ModelFrom.NONE,
        local=True,
        spends_tokens=False,
    ),
    Route(
        "content_model",
        0,
        "GET",
        "/v1beta/models/{model}",
        CONTENT,
        Body.NONE,
        ModelFrom.NONE,
        local=True,
        spends_tokens=False,
    ),
)

# The same endpoints under the paths an official SDK calls by default: the content-generation
# SDK's default API version is `v1`. An alias is its route (name, pipeline, limits, metrics) at
# another path, forwarded under that path unless the channel names a version (`content_api_version`).
ALIASES: tuple[Route, ...] = tuple(
    replace(route, path=route.path.replace("/v1beta/", "/v1/", 1))
    for route in ROUTES
    if route.name in ("generate_content", "stream_generate_content", "count_content_tokens")
)

ROUTE_NAMES = tuple(route.name for route in ROUTES)
# Routes whose requests may be sent again after an upstream took them, when the operator opts
# in (`routes.<route>.failover_unanswered`): chat, where a lost answer costs more than a repeat.
CHAT_ROUTES = frozenset({"messages", "generate_content", "stream_generate_content", "responses", "chat_completions"})
ROUTES_BY_NAME = {route.name: route for route in ROUTES}
