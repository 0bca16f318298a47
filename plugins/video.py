"""Video tasks (spec 2.1-2.3, 3, endpoints 1-5): one shape for every channel, and poll protection.

Endpoints 1-2 answer per 2.2 and 2.3 whatever shape the channel uses; endpoints 3-4 answer the
response SDK's video object (proxy/formats/video.py), and `GET /v1/videos` lists the caller's
tasks. Statuses are normalised (queued, in_progress, succeeded, failed), `data.url` always points
at the gateway's own `/v1/videos/<task_id>/content`, and failures carry `data.error {code, message}`.
Filtered videos are recognised by any of the signals channels use and shown one way: on
endpoint 2 by default exactly 2.3's filtered case, per route optionally as a failure; to the
SDK, a failure. A download of a task with no video is a clear 4xx, and one of a task never
polled asks the channel first (409 `video_not_ready` while it runs). Status answers are cached
briefly (terminal ones until they expire) and concurrent polls of one task share one upstream call.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Literal
from urllib.parse import quote

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from proxy.config import GatewayConfig
from proxy.core import jsonutil
from proxy.core.exchange import Exchange
from proxy.core.plugin import STATE_STORE, Joins, Plugin
from proxy.core.upstream_response import UpstreamResponse
from proxy.formats import VIDEO, Generation
from proxy.request.public_url import public_base_url
from proxy.state import StateStore, Write, make_store

VIDEO_OUTCOMES = Counter(
    "modelgate_video_tasks_finished",
    "Video tasks seen finishing, by outcome (succeeded, failed, filtered)",
    ["outcome"],
)

log = logging.getLogger("modelgate.video")
_SUBMIT = ("video_generations", "videos")
_STATUS = ("video_generation_status", "video_status")
_CONTENT = "video_content"
_LIST = "video_list"
_SDK_ROUTES = ("videos", "video_status")  # answered with the SDK's video object
_ASK_TIMEOUT_S = 10.0  # the longest a download waits on the status it asks its channel for
_LIMIT = re.compile(r"[0-9]{1,3}")
_STATES = {
    "queued": "queued",
    "pending": "queued",
    "submitted": "queued",
    "waiting": "queued",
    "": "queued",
    "processing": "in_progress",
    "running": "in_progress",
    "in_progress": "in_progress",
    "started": "in_progress",
    "completed": "succeeded",
    "succeeded": "succeeded",
    "success": "succeeded",
    "done": "succeeded",
    "finished": "succeeded",
    "failed": "failed",
    "failure": "failed",
    "error": "failed",
    "cancelled": "failed",
    "canceled": "failed",
    "expired": "failed",
}
_FILTERED_STATES = frozenset({"filtered", "content_filtered", "blocked"})
_FILTER_MESSAGE = "The video was blocked by content-safety filtering."


class VideoSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filtered: dict[Literal["video_generation_status", "video_status"], Literal["spec", "failure"]] = Field(
        default_factory=dict
    )  # how a route shows a filtered video; default "spec" (2.3's shape)
    status_cache_s: float = Field(default=1.0, ge=0)  # running tasks
    terminal_cache_s: float = Field(default=3600.0, ge=0)  # finished tasks
    task_record_s: int = Field(default=7 * 24 * 3600, ge=60)  # what a submission said, and whose list it is on
    list_keep: int = Field(default=100, ge=1, le=10_000)  # tasks a tenant's `GET /v1/videos` can show


class VideoTasks(Plugin):
    name = "video"
    Settings = VideoSettings
    joins = Joins(formats=frozenset({VIDEO.name}))
    requires = frozenset({"caller"})  # tasks are listed and cached per tenant
    order = 700

    def configure(self, config: GatewayConfig) -> None:
        # With Redis, the gateway's own store, where task ids are pinned: a task's record goes in
        # its pin's step (one round trip). In memory, where steps cost no round trip, a store of
        # its own, so its records and statuses never push pins out of the pins' bound.
        gateways = self.resources.get(STATE_STORE)
        self.with_pin = config.state.backend == "redis" and gateways is not None
        if not self.with_pin and "video.cache" not in self.resources:  # one for the gateway's life
            self.resources["video.cache"] = make_store(config.state)
        self.cache: StateStore = gateways() if self.with_pin else self.resources["video.cache"]
        self.inflight: dict[str, asyncio.Future[None]] = self.resources.setdefault("video.inflight", {})  # type: ignore[assignment]
        self.server = config.server

    def prefetch(self, ex: Exchange) -> None:
        if ex.route.name in _STATUS or ex.route.name == _CONTENT:  # read with the task's record and limits;
            task_id = ex.path_params["task_id"]  # used once the core has said it is the caller's
            ex.state(self)["cached"] = asyncio.get_running_loop().create_task(self._cached(task_id))

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        route = ex.route.name
        if route == _LIST:
            return await self._list(ex)
        if route not in _STATUS and route != _CONTENT:
            return None
        task_id = ex.path_params["task_id"]
        prefetched: asyncio.Task[dict[str, Any] | None] = ex.state(self).pop("cached")
        if route == _CONTENT:
            return await self._refuse_download(ex, task_id, await prefetched)
        cached = await prefetched
        if cached is None and (waiting := self.inflight.get(task_id)) is not None:
            try:  # another request is asking the upstream right now: share its answer
                await asyncio.wait_for(asyncio.shield(waiting), timeout=10)
            except (TimeoutError, asyncio.CancelledError):
                pass
            cached = await self._cached(task_id)
        if cached is not None:
            ex.generation = _generation(cached)
            return _json(200, await self._present(ex, cached))
        self.inflight[task_id] = asyncio.get_running_loop().create_future()
        ex.state(self)["leads"] = task_id  # this request leads; on_complete wakes the others
        return None

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        route = ex.route.name
        body = upstream.json()
        if route == _CONTENT and upstream.status >= 400:
            answered = upstream.status  # the channel's own error page never reaches the client
            upstream.status = answered if answered < 500 else 502
            upstream.set_json(
                ex.format.error_payload(
                    upstream.status,
                    f"the channel has no video for task {ex.path_params['task_id']} (it answered {answered})",
                    "video_unavailable",
                )
            )
            return
        if upstream.status >= 300 or not isinstance(body, dict):
            return
        if route in _SUBMIT:
            submission = _submission(body, ex.model)
            task = _task_facts(ex, body, submission)
            task["owner"] = ex.tenant or ""  # a list shows a task only to the tenant its record names
            ex.state(self)["task"] = task  # recorded under the id handed out, once it is known
            if self.with_pin and isinstance(submission["id"], str) and not self.state_away():
                # ... with the task's pin when that is the upstream's id: one step, one round trip,
                # and made only if the pin is this request's (an id another holds gets an alias).
                ttl = self.settings.task_record_s
                ex.with_pin += [
                    Write(f"video:task:{submission['id']}", jsonutil.dumps(task).decode(), ttl),
                    Write(f"video:owned:{ex.tenant or ''}", submission["id"], ttl, self.settings.list_keep),
                ]
            upstream.set_json(VIDEO.video_object(submission["id"], task, None) if route == "videos" else submission)
        elif route in _STATUS:
            normal = await self._remember_status(_status(body, ex.path_params["task_id"]))
            ex.generation = _generation(normal)
            upstream.set_json(await self._present(ex, normal))

    async def _remember_status(self, normal: dict[str, Any]) -> dict[str, Any]:
        terminal = normal["status"] in ("succeeded", "failed")
        if terminal:  # seen once per task and cache lifetime: counted as it finishes
            VIDEO_OUTCOMES.labels("filtered" if normal.get("filtered") else normal["status"]).inc()
            normal.setdefault("completed_at", int(time.time()))
        ttl = self.settings.terminal_cache_s if terminal else self.settings.status_cache_s
        if ttl > 0 and not self.state_away():
            try:
                await self.cache.set(
                    f"video:status:{normal['task_id']}", jsonutil.dumps(normal).decode(), max(1, round(ttl))
                )
            except Exception as exc:  # state unreachable: the answer is good, only the cache is lost
                log.warning("could not cache a video status: %s", exc)
        return normal

    async def on_complete(self, ex: Exchange) -> None:
        state = ex.state(self)
        task = state.get("task")
        if task is not None and ex.created_id and 200 <= ex.outcome.status < 300 and not ex.pinned_with:
            await self._record_task(ex, ex.created_id, task)  # an alias, or a pin kept while the store was away
        task_id = state.get("leads")
        if task_id is not None:
            waiting = self.inflight.pop(task_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    async def _cached(self, task_id: str) -> dict[str, Any] | None:
        if self.state_away():
            return None  # a miss: the channel is asked
        try:
            raw = await self.cache.get(f"video:status:{task_id}")
        except Exception as exc:  # state unreachable: a miss, the channel is asked
            log.warning("could not read the video status cache: %s", exc)
            return None
        return jsonutil.loads(raw) if raw else None

    async def _record_task(self, ex: Exchange, task_id: str, task: dict[str, Any]) -> None:
        """What the submission said, for the SDK's object, and the task on its tenant's list."""
        ttl = self.settings.task_record_s
        if self.state_away():
            log.warning("state store unreachable: a video task made now is not listed")
            return
        try:
            await asyncio.gather(  # together: one round trip
                self.cache.set(f"video:task:{task_id}", jsonutil.dumps(task).decode(), ttl),
                self.cache.push(f"video:owned:{ex.tenant or ''}", task_id, ttl, self.settings.list_keep),
            )
        except Exception as exc:  # the task runs all the same; only its listing is lost
            log.warning("could not record a video task: %s", exc)

    async def _task(self, task_id: str) -> dict[str, Any]:
        if self.state_away():
            return {}
        try:
            raw = await self.cache.get(f"video:task:{task_id}")
        except Exception as exc:
            log.warning("could not read a video task record: %s", exc)
            return {}
        return jsonutil.loads(raw) if raw else {}

    async def _list(self, ex: Exchange) -> web.Response:
        """`GET /v1/videos`: the caller's tenant's tasks, newest first (`order=asc` turns it), from
        what the gateway last saw of each; `limit` (1-100) and `after` page through them."""
        assert ex.target is not None
        query = {name: value or "" for name, value in ex.target.query}
        limit = query.get("limit", "20")
        if not _LIMIT.fullmatch(limit) or not 1 <= int(limit) <= 100:
            return ex.error_response(400, "limit: must be a whole number from 1 to 100", param="limit")
        if query.get("order", "desc") not in ("asc", "desc"):
            return ex.error_response(400, "order: must be asc or desc", param="order")
        try:
            if self.state_away():
                raise ConnectionError("the state store is unreachable")
            ids = await self.cache.recent(f"video:owned:{ex.tenant or ''}", self.settings.list_keep)
        except Exception:
            return ex.error_response(
                503,
                "the gateway cannot read its task list right now; retry shortly",
                "state_unavailable",
                headers={"Retry-After": "2"},
            )
        if query.get("order") == "asc":
            ids.reverse()
        if (after := query.get("after")) in ids:
            ids = ids[ids.index(after) + 1 :]
        page = ids[: int(limit)]
        found = await asyncio.gather(*(self._task(t) for t in page), *(self._cached(t) for t in page))  # one round trip
        # An id on this list whose record names another tenant was handed to that one since (its
        # pin lapsed and the upstream gave the id again): it is no longer this tenant's to show.
        tenant = ex.tenant or ""
        objects = [
            VIDEO.video_object(task_id, found[i], found[len(page) + i])
            for i, task_id in enumerate(page)
            if found[i].get("owner", tenant) == tenant
        ]
        return _json(200, VIDEO.video_list(objects, has_more=len(ids) > len(page)))

    async def _ask_channel(self, ex: Exchange, task_id: str) -> dict[str, Any] | None:
        """The status of a task never polled through this gateway, from the channel that holds it;
        None when it cannot be asked (the download then goes to the channel as it is)."""
        followed = ex.followed
        channel = self.channels.get(followed.channel) if self.channels is not None and followed else None
        if channel is None or channel.pool is None:
            return None
        headers: CIMultiDict[str] = CIMultiDict()
        ex.format.place_credential(channel.credential, headers)
        upstream_id = followed.upstream_id if followed and followed.upstream_id else task_id
        try:
            answer = await channel.pool.request(
                "GET",
                "/v1/videos/" + quote(upstream_id, safe="@+=:~"),
                headers,
                total_s=min(channel.timeouts.first_byte_s, _ASK_TIMEOUT_S),
            )
            try:
                body = jsonutil.loads(await answer.read(limit=1024 * 1024))
            finally:
                answer.release()
            if answer.status >= 300 or not isinstance(body, dict):
                return None
            normal = _status(body, task_id)
        except Exception:  # unreachable, slow, or an answer that cannot be read: the channel has the download
            return None
        return await self._remember_status(normal)

    async def _refuse_download(
        self, ex: Exchange, task_id: str, known: dict[str, Any] | None
    ) -> web.StreamResponse | None:
        if known is None:
            known = await self._ask_channel(ex, task_id)
        if known is not None:
            ex.generation = _generation(known)
        if known is None or known["status"] == "succeeded" and not known.get("filtered"):
            return None  # unknown here, or ready: the channel answers (a refusal there is made clear too)
        if known.get("filtered"):
            return ex.error_response(
                404, f"task {task_id} has no video: it was blocked by content filtering", "content_filtered"
            )
        if known["status"] == "failed":
            return ex.error_response(404, f"task {task_id} failed and has no video", "video_failed")
        return ex.error_response(
            409,
            f"task {task_id} is {known['status']}; its video is not ready yet",
            "video_not_ready",
            headers={"Retry-After": "5"},
        )

    async def _present(self, ex: Exchange, normal: dict[str, Any]) -> dict[str, Any]:
        """The answer for this request: on endpoint 4 the SDK's video object; on endpoint 2, 2.3's,
        with URLs on this gateway and filtered tasks in the route's mode."""
        task_id = normal["task_id"]
        if ex.route.name in _SDK_ROUTES:
            return VIDEO.video_object(task_id, await self._task(task_id), normal)
        data: dict[str, Any] = {
            "task_id": task_id,
            "status": normal["status"],
            "format": "mp4",
            "url": "",
            "error": normal.get("error"),
            "metadata": None,
        }
        if normal.get("progress") is not None:
            data["progress"] = normal["progress"]
        if normal.get("filtered"):
            reasons = normal.get("reasons") or []
            if self.settings.filtered.get(ex.route.name, "spec") == "failure":
                data.update(
                    status="failed",
                    error={"code": "content_filtered", "message": normal["message"], "reasons": reasons},
                )
            else:
                data.update(
                    status="succeeded",
                    url=normal["message"],
                    bytes_base64_encoded="",
                    metadata={
                        "rai_media_filtered_count": normal.get("count", 1),
                        "rai_media_filtered_reasons": reasons,
                    },
                )
        elif normal["status"] == "succeeded":
            data["url"] = f"{public_base_url(ex.request, self.server)}/v1/videos/{quote(str(task_id), safe='')}/content"
        return {"code": "success", "message": "", "data": data}


def _submission(body: dict[str, Any], model: str | None) -> dict[str, Any]:
    data = body.get("data") if isinstance(body.get("data"), dict) else {}
    task_id = body.get("task_id") or body.get("id") or data.get("task_id") or data.get("id") or body.get("name")
    created = body.get("created_at") or data.get("created_at")
    return {
        "id": task_id,
        "task_id": task_id,
        "object": "video",
        "model": body.get("model") or model,
        "status": "",
        "progress": 0,
        "created_at": created if isinstance(created, int) else int(time.time()),
    }


def _task_facts(ex: Exchange, body: dict[str, Any], submission: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's video object tells of a task beyond its status: from the upstream's answer,
    else from the request (its JSON body, or its form fields)."""
    sent = ex.json() if ex.multipart is None else ex.multipart.fields()
    sent = sent if isinstance(sent, dict) else {}
    facts: dict[str, Any] = {"model": submission["model"], "created_at": submission["created_at"]}
    for name in ("prompt", "seconds", "size"):
        value = body.get(name) if body.get(name) is not None else sent.get(name)
        facts[name] = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    return facts


def _status(body: dict[str, Any], task_id: str) -> dict[str, Any]:
    """What a channel said about a task, in one vocabulary (not yet the 2.3 shape)."""
    data = body.get("data") if isinstance(body.get("data"), dict) else body
    raw = str(data.get("status") or data.get("state") or "").lower()
    status = _STATES.get(raw, "queued")
    normal: dict[str, Any] = {"task_id": task_id, "status": status}  # the id the client asked about
    if isinstance(data.get("progress"), int):
        normal["progress"] = data["progress"]
    if isinstance(data.get("completed_at"), int):
        normal["completed_at"] = data["completed_at"]
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    count = metadata.get("rai_media_filtered_count") or metadata.get("raiMediaFilteredCount") or 0
    reasons = metadata.get("rai_media_filtered_reasons") or metadata.get("raiMediaFilteredReasons") or []
    url = data.get("url")
    filtered = (
        raw in _FILTERED_STATES
        or bool(count)
        or bool(reasons)
        or data.get("filtered") is True
        or status == "succeeded"
        and isinstance(url, str)
        and url
        and not url.startswith(("http://", "https://"))
    )
    if filtered:
        message = url if isinstance(url, str) and url and not url.startswith("http") else _FILTER_MESSAGE
        count = count if isinstance(count, int) and not isinstance(count, bool) and 0 < count < 2**31 else 1
        normal.update(
            status="succeeded",
            filtered=True,
            count=count,
            message=message,
            reasons=[str(r) for r in reasons] if isinstance(reasons, list) else [str(reasons)],
        )
    elif status == "failed":
        error = data.get("error")
        if isinstance(error, dict):
            normal["error"] = {
                "code": str(error.get("code") or "generation_failed"),
                "message": str(error.get("message") or "the video generation failed"),
            }
        else:
            normal["error"] = {"code": "generation_failed", "message": str(error or "the video generation failed")}
    return normal


def _generation(normal: dict[str, Any]) -> Generation:
    """A task's status as the end of its generation, for its charge: a failed task made nothing
    the upstream bills; a filtered one was made, and is charged as made."""
    status = normal["status"]
    return Generation(status in ("succeeded", "failed"), failed=status == "failed" and not normal.get("filtered"))


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=jsonutil.dumps(body), content_type="application/json")
