"""Calls to Redis made in one turn of the event loop go together, as one pipeline.

A request's state work is several small calls: the record of the id it follows, its limit
check, a cached status; after the answer, its pin, its settlement, an image. Each sent on its
own costs a round trip's wait, a write, a read and the client's work per command. Made in
the same turn (started together, not awaited one by one), they share one write and one read;
under load, the calls of many requests share them too.

When a pipeline's connection fails, its plain commands that may run twice (a read, a SET) are
sent once more; its scripts are not (one may have run): their callers hear of the failure.
An error reaches exactly the calls it concerns: a script Redis no longer knows (after a restart
or a failover) is loaded and its calls sent once more, safe because Redis refused them unrun.

A user with many small writes of one kind in a turn (the ledger's journal: a record per request)
may make them one call instead: it asks to be called back as the turn's calls are sent
(`at_flush`), and then makes its one call, which goes in the same pipeline.

On a Cluster nothing is gathered: its client pipelines no scripts, and splits a pipeline by
node anyway. Each call goes at once, to its own node.

A call that timed out before it was sent (its pipeline waiting for a connection a stalled Redis
never finished) is then never sent, so it certainly did not run: a caller counting what it could
not record needs to know, and asks for the call's receipt (`script_with_receipt`) to read it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError, DataError, NoScriptError, ReadOnlyError, ResponseError

from proxy.state.packing import pack

log = logging.getLogger("modelgate.state")

T = TypeVar("T")
# Connections kept between pipelines: a burst may take many more, which then go back to the pool
# (its slack above the calls in flight is small: the client's own commands need some).
_MOST_KEPT = 32


async def answer_within(answer: asyncio.Future[T], seconds: float) -> T:
    """A call's answer, or TimeoutError once `seconds` have passed without one (the answer
    arriving later is dropped). One timer on the loop: asyncio.wait_for adds a future, a callback
    and a turn of the loop to every call, and a request makes two or three of them."""
    late = asyncio.get_running_loop().call_later(seconds, _expire, answer)
    try:
        return await answer
    finally:
        late.cancel()


def _expire(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


@dataclass(slots=True)
class _Call:
    args: tuple[Any, ...]  # a command and its arguments; for a script, its keys and arguments
    script: AsyncScript | None
    resend: bool  # may run twice
    # A plain future: a subclass would take the tasks awaiting it off asyncio's fast path.
    answer: asyncio.Future[Any]
    sent: bool = False  # its bytes went to Redis (it may have run, answered or not)


class Receipt(Protocol):
    sent: bool


class Gatherer:
    __slots__ = ("_client", "_gathers", "_queued", "_sending", "_idle", "_before", "_scheduled", "_to_primary")

    def __init__(self, client: Any, gathers: bool = True) -> None:
        self._client = client
        self._gathers = gathers
        self._queued: list[_Call] = []
        self._before: list[Callable[[], None]] = []  # called as this turn's calls are sent (at_flush)
        self._scheduled = False  # this turn's calls are to be sent
        self._sending: set[asyncio.Task[None]] = set()  # referenced until done
        # Connections of the client's pool this gatherer keeps for its pipelines (as many as ran at
        # once, up to _MOST_KEPT); the client's close disconnects them with the rest of its pool.
        self._idle: list[Any] = []
        # Sentinel's primary (a Cluster's client has no one pool)
        self._to_primary = bool(getattr(getattr(client, "connection_pool", None), "is_master", False))

    @property
    def gathers(self) -> bool:
        """Whether calls of one turn share a pipeline (not on a Cluster)."""
        return self._gathers

    def command(self, *args: Any, resend: bool = True) -> asyncio.Future[Any]:
        """Send `args` (a command name and its arguments) with the calls of this turn; the future
        holds Redis's answer, or what Redis or the connection raised. `resend`: it may run twice."""
        return self._queue(_Call(args, None, resend, asyncio.get_running_loop().create_future()))

    def script(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any], alone: bool = False
    ) -> asyncio.Future[Any]:
        """Run `script` with the calls of this turn (never twice); `alone`: at once, on its own
        (a large write, which would hold up every call that shared its pipeline)."""
        call = _Call((len(keys), *keys, *args), script, False, asyncio.get_running_loop().create_future())
        return self._queue(call, alone)

    def script_with_receipt(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[asyncio.Future[Any], Receipt]:
        """`script`, with the receipt that says, once its answer timed out, whether it was sent."""
        call = _Call((len(keys), *keys, *args), script, False, asyncio.get_running_loop().create_future())
        return self._queue(call), call

    def at_flush(self, make_calls: Callable[[], None]) -> None:
        """Call `make_calls` once, just before the calls of this turn are sent: the calls it makes
        then go with them (on a Cluster, where nothing is gathered, it is called soon)."""
        if not self._gathers:
            asyncio.get_running_loop().call_soon(make_calls)
            return
        self._schedule()
        self._before.append(make_calls)

    def _queue(self, call: _Call, alone: bool = False) -> asyncio.Future[Any]:
        if alone or not self._gathers:
            self._start([call])
        else:
            self._schedule()
            self._queued.append(call)
        return call.answer

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        before, self._before = self._before, []
        for make_calls in before:
            try:
                make_calls()
            except Exception:  # its own calls are lost; the others' go
                log.exception("a call made as a pipeline was sent failed")
        self._scheduled = False
        calls, self._queued = self._queued, []
        if calls:
            self._start(calls)

    def _start(self, calls: list[_Call]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[_Call]) -> None:
        try:
            if not self._gathers:  # a Cluster's client, which routes each call to its node
                calls[0].sent = True  # as good as: when its bytes go is the client's to say
                _settle(calls[0].answer, await self._alone(calls[0]))
                return
            try:
                # One call alone goes this way too: redis-py's own path for it (its pool's lock and
                # bookkeeping, a script object's round of EVALSHA) cost several times as much.
                answers = await self._pipeline(calls)
            except DataError:
                # A call that cannot be packed (a string UTF-8 cannot hold, say) fails its pipeline
                # before a byte is sent: each call then goes alone, so only that one hears of it.
                for call in calls:
                    call.sent = True  # as good as (see above)
                alone = await asyncio.gather(*(self._alone(c) for c in calls), return_exceptions=True)
                for call, result in zip(calls, alone):
                    _settle(call.answer, result)
                return
            except ConnectionError as exc:
                # Those that may run twice are sent once more (a connection found dead after a
                # restart); a script may have run, and its caller hears of the failure.
                again = [c for c in calls if c.resend]
                for call in calls:
                    if not call.resend:
                        _settle(call.answer, exc)
                if not again:
                    return
                calls, answers = again, await self._pipeline(again)
            lost = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
            for call, result in zip(calls, answers):  # first, what ran: whatever happens next,
                if not isinstance(result, NoScriptError):  # its callers hear its own answer
                    _settle(call.answer, result)
            if lost:
                # Loaded in the pipeline that sends them again, on a connection just seen to answer
                # (another of the pool's may be one the server closed, not yet known to be).
                scripts = list({calls[i].script.sha: calls[i].script for i in lost}.values())  # type: ignore[union-attr]
                loads = [
                    _Call(
                        ("SCRIPT", "LOAD", script.script),
                        None,
                        True,  # type: ignore[union-attr]
                        asyncio.get_running_loop().create_future(),
                    )
                    for script in scripts
                ]
                again = await self._pipeline([*loads, *(calls[i] for i in lost)])
                # A script that cannot be loaded fails its own calls only (they hear why).
                unloaded = {
                    script.sha: answer
                    for script, answer in zip(scripts, again)  # type: ignore[union-attr]
                    if isinstance(answer, BaseException)
                }
                for i, answer in zip(lost, again[len(loads) :]):
                    _settle(calls[i].answer, unloaded.get(calls[i].script.sha, answer))  # type: ignore[union-attr]
        except BaseException as exc:  # the connection failed, or this task was cancelled: every call hears it
            for call in calls:
                if not call.answer.done():
                    call.answer.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            if not isinstance(exc, Exception):
                raise

    async def _alone(self, call: _Call) -> Any:
        if call.script is not None:
            count, *rest = call.args
            return await call.script(keys=rest[:count], args=rest[count:])
        try:
            return await self._client.execute_command(*call.args)
        except ConnectionError:
            if not call.resend:
                raise
            return await self._client.execute_command(*call.args)

    async def _connection(self) -> Any:
        """A kept connection still fit to send on, or one from the client's pool (which checks its
        own). A kept one the server closed meanwhile (a restart, a failover, its idle timeout) is
        dropped before a byte goes on it: nothing on it ran, and nothing need be refused."""
        while self._idle:
            kept = self._idle.pop()
            if _unbroken(kept):
                try:
                    if not await kept.can_read():  # closed, or holding bytes nobody asked for
                        return kept
                except (ConnectionError, OSError):
                    pass
            await self._drop(kept)
        return await self._client.connection_pool.get_connection()

    async def _drop(self, connection: Any) -> None:
        """Disconnect, not waiting on a send buffer a stalled Redis never drains, and give its slot
        in the pool back whatever happens (a slot not given back is one less for good)."""
        try:
            await connection.disconnect(nowait=True)
        except Exception:  # noqa: BLE001 - closing what failed may fail too
            pass
        finally:
            await self._client.connection_pool.release(connection)

    async def _pipeline(self, calls: Sequence[_Call]) -> list[Any]:
        """The calls on one connection: packed in one write, their answers read in order, each
        through the client's callback for its command (what redis-py's pipeline does, less its
        per-command bookkeeping, retries and timings). The connection is one of the gatherer's
        own, kept between pipelines (redis-py's pool takes and gives back a connection with a
        lock and its own bookkeeping: 20-30 us a pipeline); one that fails mid-way is dropped,
        never reused with answers unread on it. An answer that is an error takes its call's place."""
        client = self._client
        packed = _packed(calls)  # a call that cannot be packed fails here, before a byte is sent
        async with client.gate:  # one connection's turn
            connection = await self._connection()
            # A call whose caller stopped waiting (a stalled Redis, a new connection's handshake) was
            # told it timed out unsent: never sent, that stays true. (One whose caller was cancelled
            # goes: a request that went away still makes the writes it started.)
            expired = False
            for call in calls:
                answer = call.answer
                if answer.done() and not answer.cancelled() and not call.sent:
                    expired = True
                else:
                    call.sent = True
            live = [call for call in calls if call.sent] if expired else calls
            if expired:
                packed = _packed(live)
            try:
                # One timeout for the write and all the answers (past it, the builtin TimeoutError).
                async with asyncio.timeout(connection.socket_timeout):
                    read = await connection.exchange(packed, len(live)) if live else []  # proxy/state/packing.py
                if live is not calls:  # an answer nobody waits for in the place of each call not sent
                    given = iter(read)
                    read = [next(given) if call.sent else TimeoutError() for call in calls]
                if self._to_primary and any(isinstance(answer, ReadOnlyError) for answer in read):
                    # The primary Sentinel named is a replica now (demoted without its clients being
                    # killed): as redis-py's Sentinel connection does, the connection fails, is
                    # dropped with the kept ones, and what may run twice goes again (refused, it never ran).
                    raise ConnectionError("the primary is now a replica")
                callbacks = client.response_callbacks
                answers: list[Any] = []
                for call, answer in zip(calls, read):
                    if isinstance(answer, ResponseError):
                        answers.append(answer)
                        continue
                    callback = None if call.script is not None else callbacks.get(call.args[0])
                    answers.append(callback(answer) if callback is not None else answer)
            except BaseException as exc:
                # Dropped; and when the connection failed (a Redis restarted, a primary failed over),
                # the kept ones with it: they are as stale, and redis-py's pool checks each it hands out.
                # Not for a timeout (a slow Redis): the others are fine, and would be made again for nothing.
                failed = isinstance(exc, (ConnectionError, OSError)) and not isinstance(exc, TimeoutError)
                dropped = [connection, *(self._idle if failed else ())]
                if len(dropped) > 1:
                    self._idle = []
                for stale in dropped:
                    await self._drop(stale)
                raise
            if len(self._idle) < _MOST_KEPT:
                self._idle.append(connection)
            else:  # a burst's connections go back to the pool, for the client's own commands
                await client.connection_pool.release(connection)
            return answers


def _packed(calls: Sequence[_Call]) -> bytes:
    return b"".join(
        pack(*(("EVALSHA", call.script.sha, *call.args) if call.script is not None else call.args)) for call in calls
    )


def _unbroken(connection: Any) -> bool:
    """Not reset by the peer (a reset sets an error on the reader, not its end of file, which
    can_read looks for) nor closing."""
    reader, writer = getattr(connection, "_reader", None), getattr(connection, "_writer", None)
    if reader is not None and reader.exception() is not None:
        return False
    return writer is None or not writer.transport.is_closing()


def _settle(answer: asyncio.Future[Any], result: Any) -> None:
    if answer.done():  # its caller went away meanwhile
        return
    if isinstance(result, BaseException):
        answer.set_exception(result if isinstance(result, Exception) else ConnectionError("cancelled"))
    else:
        answer.set_result(result)
