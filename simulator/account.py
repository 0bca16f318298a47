"""Simulated account backend: the 2FA login and the payment webhook echo what they were sent."""

from __future__ import annotations

import hashlib

from aiohttp import web

from proxy.formats import ACCOUNT
from simulator.core import Simulator, json_answer


async def login(sim: Simulator, request: web.Request) -> web.Response:
    await sim.receive(request, ACCOUNT)
    token = sim.new_id("session")
    response = json_answer(
        {"success": True, "message": "", "data": {"token": token, "two_factor": "verified"}},
        request,
        headers={"Cache-Control": "no-store"},
    )
    response.headers.add("Set-Cookie", f"session={token}; Path=/; HttpOnly; SameSite=Lax")
    response.headers.add("Set-Cookie", "2fa=ok; Path=/; HttpOnly")
    return response


async def webhook(sim: Simulator, request: web.Request) -> web.Response:
    await sim.receive(request, ACCOUNT)
    record = sim.requests[-1]
    signatures = {k: v for k, v in record.headers if "signature" in k.lower()}
    return json_answer(
        {
            "received": True,
            "provider": request.match_info["provider"],
            "bytes": record.body_size,
            "sha256": hashlib.sha256(record.body or b"").hexdigest() if record.body is not None else record.body_sha256,
            "signature_headers": signatures,
        },
        request,
    )
