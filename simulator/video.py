"""Simulated video tasks: queued, then processing, then succeeded (or filtered, or failed), and a download.

The prompt decides the ending: `[sim:filtered]` gives the filtered case of spec 2.3,
`[sim:fail]` a failed task; otherwise the task succeeds. Timing comes from the settings.
Like the upstream the spec describes, it reports `processing` and `completed`; with
`x-sim-video-shape: nested` a submission answers `{code, data: {task_id, state}}`.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from dataclasses import dataclass

from aiohttp import web

from proxy.formats import VIDEO
from simulator.core import Answer, Simulator, json_answer, now

VIDEO_SIZE = 512 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(slots=True)
class VideoTask:
    task_id: str
    model: str
    ending: str  # succeeded | filtered | failed
    created: float
    queued_s: float
    processing_s: float

    def status(self) -> str:
        elapsed = time.monotonic() - self.created
        if elapsed < self.queued_s:
            return "queued"
        if elapsed < self.queued_s + self.processing_s:
            return "processing"
        return "failed" if self.ending == "failed" else "completed"  # the upstream's word; 2.3 says succeeded

    def progress(self) -> int:
        total = self.queued_s + self.processing_s
        return 100 if total <= 0 else min(100, int(100 * (time.monotonic() - self.created) / total))


def video_bytes(task_id: str) -> bytes:
    """Deterministic bytes that start like an MP4 file."""
    rng = random.Random(task_id)
    head = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41"
    return head + rng.randbytes(VIDEO_SIZE - len(head))


async def submit(sim: Simulator, request: web.Request) -> web.Response:
    body, _ = await sim.receive(request, VIDEO)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        raise Answer(VIDEO.error_response(400, "prompt is required"))
    prompt = body["prompt"]
    ending = "filtered" if "[sim:filtered]" in prompt else "failed" if "[sim:fail]" in prompt else "succeeded"
    task = VideoTask(
        sim.new_id("task"),
        str(body.get("model", "")),
        ending,
        time.monotonic(),
        sim.settings.video_queued_s,
        sim.settings.video_processing_s,
    )
    sim.remember(sim.videos, task.task_id, task)
    if ending != "failed":  # made, whatever anyone reads of it (a filtered one too)
        sim.produce(video_seconds=VIDEO.seconds_made(body)[0])
    if request.headers.get("x-sim-video-shape") == "nested":  # another upstream's way of saying it
        return json_answer({"code": "success", "data": {"task_id": task.task_id, "state": "submitted"}}, request)
    return json_answer(
        {
            "id": task.task_id,
            "task_id": task.task_id,
            "object": "video",
            "model": task.model,
            "status": "",
            "progress": 0,
            "created_at": now(),
        },
        request,
    )


def _task(sim: Simulator, request: web.Request) -> VideoTask:
    task = sim.videos.get(request.match_info["task_id"])
    if task is None:
        raise Answer(VIDEO.error_response(404, f"task {request.match_info['task_id']} not found"))
    return task


async def status(sim: Simulator, request: web.Request) -> web.Response:
    await sim.receive(request, VIDEO)
    task = _task(sim, request)
    sim.remember(sim.status_calls, task.task_id, sim.status_calls[task.task_id] + 1)
    state = task.status()
    data = {
        "task_id": task.task_id,
        "status": state,
        "format": "mp4",
        "url": "",
        "error": None,
        "metadata": None,
        "progress": task.progress(),
    }
    if state == "completed" and task.ending == "filtered":
        data.update(
            url="The video was blocked by content-safety filtering.",
            bytes_base64_encoded="",
            metadata={
                "rai_media_filtered_count": 1,
                "rai_media_filtered_reasons": ["The prompt violates the usage guidelines."],
            },
        )
    elif state == "completed":
        data["url"] = f"{request.scheme}://{request.host}/v1/videos/{task.task_id}/content"
    elif state == "failed":
        data["error"] = {"code": "generation_failed", "message": "the simulated generation failed"}
    return json_answer({"code": "success", "message": "", "data": data}, request)


async def content(sim: Simulator, request: web.Request) -> web.StreamResponse:
    await sim.receive(request, VIDEO)
    task = _task(sim, request)
    if task.status() != "completed" or task.ending != "succeeded":
        raise Answer(VIDEO.error_response(404, f"task {task.task_id} has no video"))
    data = video_bytes(task.task_id)
    etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
    headers = {"Content-Type": "video/mp4", "Accept-Ranges": "bytes", "ETag": etag}
    start, end = 0, len(data) - 1
    status_code = 200
    wanted = request.headers.get("Range")
    if wanted:
        match = _RANGE.match(wanted.strip())
        if match is None or (not match[1] and not match[2]):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        if match[1]:
            start = int(match[1])
            end = min(int(match[2]), len(data) - 1) if match[2] else len(data) - 1
        else:
            start = max(0, len(data) - int(match[2]))
        if start > end:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        status_code = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    response = web.StreamResponse(status=status_code, headers=headers)
    response.content_length = end - start + 1
    await response.prepare(request)
    if request.method != "HEAD":
        for offset in range(start, end + 1, 64 * 1024):
            await response.write(data[offset : min(offset + 64 * 1024, end + 1)])
    await response.write_eof()
    return response
