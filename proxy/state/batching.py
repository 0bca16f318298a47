"""Script calls made while others are on their way to Redis go together, as one pipeline.

Under load many requests check their limits at about the same moment; each call on its own
costs a write, a read and the client's own work per command, which is most of what a limit
check costs the gateway. A call made while none is in flight goes at once, as before; calls
made while one is, are gathered over one turn of the event loop and share one write and one read.

A pipeline is never resent (a script in it may have run), and an error reaches exactly the calls
it concerns: a script Redis no longer knows (after a restart or a failover) is loaded and its
calls sent once more, which is safe because Redis refused them unrun.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


class ScriptBatcher:
    __slots__ = ("_client", "_queued", "_flushing", "_in_flight")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queued: list[tuple[AsyncScript, Sequence[str], Sequence[Any], asyncio.Future[Any]]] = []
        self._flushing: set[asyncio.Task[None]] = set()  # referenced until done
        self._in_flight = 0  # calls sent on their own, not yet answered

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """What `script` answers for `keys` and `args`; raises what Redis or the connection raised."""
        if not self._in_flight and not self._queued and not self._flushing:  # idle: no one to wait for
            self._in_flight += 1
            try:
                return await script(keys=keys, args=args)
            finally:
                self._in_flight -= 1
        loop = asyncio.get_running_loop()
        if not self._queued:
            loop.call_soon(self._flush)
        answer: asyncio.Future[Any] = loop.create_future()
        self._queued.append((script, keys, args, answer))
        return await answer

    def _flush(self) -> None:
        calls, self._queued = self._queued, []
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send(self, calls: list[tuple[AsyncScript, Sequence[str], Sequence[Any], asyncio.Future[Any]]]) -> None:
        try:
            if len(calls) == 1:  # nothing to gather: the script object loads itself if Redis lost it
                script, keys, args, answer = calls[0]
                _settle(answer, await script(keys=keys, args=args))
                return
            answers = await self._pipeline(calls)
            lost = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
            for (_, _, _, answer), result in zip(calls, answers):  # first, what ran: whatever happens next,
                if not isinstance(result, NoScriptError):          # its callers hear its own answer
                    _settle(answer, result)
            if lost:
                for script in {calls[i][0] for i in lost}:
                    await self._client.script_load(script.script)
                for i, again in zip(lost, await self._pipeline([calls[i] for i in lost])):
                    _settle(calls[i][3], again)
        except BaseException as exc:  # the connection failed, or this task was cancelled: every call hears it
            for *_, answer in calls:
                if not answer.done():
                    answer.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            if not isinstance(exc, Exception):
                raise

    async def _pipeline(self, calls: Sequence[tuple[AsyncScript, Sequence[str], Sequence[Any], Any]]) -> list[Any]:
        async with self._client.gate, self._client.pipeline(transaction=False) as pipe:  # one connection's turn
            for script, keys, args, _ in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            return await pipe.execute(raise_on_error=False)


def _settle(answer: asyncio.Future[Any], result: Any) -> None:
    if answer.done():  # its caller went away meanwhile
        return
    if isinstance(result, Exception):
        answer.set_exception(result)
    else:
        answer.set_result(result)
