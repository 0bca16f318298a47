"""An upstream simulator that answers every endpoint of the spec as a real upstream would.

It serves the gateway out of the box (`base_url: simulator`), and the tests and the
benchmark drive it through its knobs (see simulator.core). `/_sim/requests` and
`/_sim/stats` show what it received.
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from proxy.config.model import SimulatorSettings
from proxy.core import jsonutil
from simulator import account, chat, companions, completions, media, responses, video
from simulator.core import Simulator, answer_early

SIMULATOR_KEY = web.AppKey("simulator", Simulator)


def build_simulator_app(sim: Simulator) -> web.Application:
    app = web.Application(middlewares=[answer_early(sim)], client_max_size=1024**4)
    app[SIMULATOR_KEY] = sim
    add = app.router.add_route
    for path in ("/v1/video/generations", "/v1/videos"):
        add("POST", path, partial(video.submit, sim))
    for path in ("/v1/video/generations/{task_id}", "/v1/videos/{task_id}"):
        app.router.add_get(path, partial(video.status, sim))
    app.router.add_get("/v1/videos/{task_id}/content", partial(video.content, sim))
    add("POST", "/v1/images/generations", partial(media.images, sim))
    add("POST", "/v1/images/edits", partial(media.images, sim))
    add("POST", "/v1/messages", partial(chat.messages, sim))
    for version in ("v1beta", "v1"):
        add("POST", f"/{version}/models/{{model}}:generateContent", partial(chat.generate_content, sim))
        add("POST", f"/{version}/models/{{model}}:streamGenerateContent", partial(chat.generate_content, sim))
    add("POST", "/v1/responses", partial(responses.responses, sim))
    add("POST", "/v1/chat/completions", partial(completions.completions, sim))
    add("POST", "/v1/messages/count_tokens", partial(companions.count_tokens, sim))
    for version in ("v1beta", "v1"):
        add("POST", f"/{version}/models/{{model}}:countTokens", partial(companions.count_content_tokens, sim))
    app.router.add_get("/v1/responses/{response_id}", partial(responses.stored_response, sim))
    add("DELETE", "/v1/responses/{response_id}", partial(responses.stored_response, sim))
    app.router.add_get("/v1/responses/{response_id}/input_items", partial(responses.stored_response, sim))
    add("POST", "/v1/responses/{response_id}/cancel", partial(responses.stored_response, sim))
    add("POST", "/api/user/login/2fa", partial(account.login, sim))
    add("POST", "/api/{provider}/webhook", partial(account.webhook, sim))
    app.router.add_get("/_sim/files/{file_id}.png", partial(media.file, sim))
    app.router.add_get("/_sim/requests", partial(_requests, sim))
    app.router.add_get("/_sim/stats", partial(_stats, sim))
    add("POST", "/_sim/reset", partial(_reset, sim))
    return app


async def _requests(sim: Simulator, request: web.Request) -> web.Response:
    return web.Response(body=jsonutil.dumps([r.as_json() for r in sim.requests]), content_type="application/json")


async def _stats(sim: Simulator, request: web.Request) -> web.Response:
    return web.Response(body=jsonutil.dumps(sim.stats()), content_type="application/json")


async def _reset(sim: Simulator, request: web.Request) -> web.Response:
    sim.requests.clear()
    sim.status_calls.clear()
    sim.aborted = sim.streams_started = 0
    return web.Response(status=204)


__all__ = ["SIMULATOR_KEY", "Simulator", "SimulatorSettings", "build_simulator_app"]
