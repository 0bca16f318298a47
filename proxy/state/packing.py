"""Commands packed for the wire by hiredis, in C, rather than by redis-py's Python.

redis-py's asyncio connections encode each argument and join the pieces in Python: with the
limiter's twenty-odd arguments, about a tenth of the client's CPU for a script call (measured on
one core here: 116 us a call, 103 us packed by hiredis). hiredis (a dependency already: it
parses the answers) packs the same bytes; a test holds the two to that, argument type by
argument type. What neither packs (None, a bool, a list; a string with a lone surrogate, which
UTF-8 cannot hold) is refused with redis-py's DataError, a RedisError that every caller handles
as it handles Redis being away, before anything is sent (redis-py itself would raise a bare
UnicodeEncodeError for the last).

A gathered pipeline (proxy/state/gathering.py) is sent and its answers read the same way
(`HiredisPacking.exchange`): one write, and one loop over the connection's own hiredis reader.
redis-py's send_packed_command puts each write under asyncio.wait_for (a task of its own on this
Python) and its read_response goes through three coroutines and a timer an answer: for the calls
a request makes, about 28,000 instructions, 2% of a request (bench/RESULTS.md, ledger-instructions).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import hiredis
from redis.exceptions import ConnectionError, DataError, ResponseError

try:  # what the connection's hiredis reader answers while an answer is incomplete (redis-py's own)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH
except ImportError:  # another redis-py: its read_response is used
    _NOT_ENOUGH = None
_PUSH = getattr(hiredis, "PushNotification", None)


def pack(*args: Any) -> bytes:
    """One command as the wire carries it."""
    try:
        first = args[0]
        if isinstance(first, str):  # 'CONFIG GET' is two words on the wire, as redis-py sends it
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        return hiredis.pack_command(args)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:  # a type it takes not, a string UTF-8 cannot hold
        raise DataError(f"{type(exc).__name__}: {exc}"[:200]) from None


class HiredisPacking:
    """A mixin for a redis-py asyncio connection class: commands packed by hiredis, and a
    pipeline's answers read by it."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return [pack(*args)]

    async def exchange(self, packed: bytes, count: int) -> list[Any]:
        """Send `packed` (`count` commands) and read their `count` answers, an error answer in its
        place (a ResponseError); a connection that fails raises ConnectionError, and is the
        caller's to drop. No timeout of its own: the caller puts one around it."""
        parser = self._parser  # type: ignore[attr-defined]
        reader = getattr(parser, "_reader", None)
        if _NOT_ENOUGH is None or not isinstance(reader, hiredis.Reader):  # another parser: redis-py's way
            return await self._exchange_slowly(packed, count)
        try:
            writer = self._writer  # type: ignore[attr-defined]
            writer.write(packed)
            await writer.drain()
            answers: list[Any] = []
            while len(answers) < count:
                answer = reader.gets()
                if answer is _NOT_ENOUGH:
                    await parser.read_from_socket()  # raises ConnectionError at the end of the stream
                elif _PUSH is not None and isinstance(answer, _PUSH):
                    # A RESP3 push is never an answer (no call of ours subscribes). redis-py's push
                    # handlers are not called: the maintenance notices they serve are a managed
                    # Redis's, which open-source Redis does not send.
                    continue
                elif isinstance(answer, ConnectionError):
                    raise answer
                else:
                    answers.append(answer)
            return answers
        except OSError as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange_slowly(self, packed: bytes, count: int) -> list[Any]:
        await self.send_packed_command(packed, check_health=False)  # type: ignore[attr-defined]
        answers: list[Any] = []
        for _ in range(count):
            try:
                answers.append(await self.read_response(timeout=math.inf))  # type: ignore[attr-defined]
            except ResponseError as exc:
                answers.append(exc)
        return answers


@functools.cache
def packing_with_hiredis(connection_class: type) -> type:
    """`connection_class` (redis-py's plain, TLS, unix-socket, Sentinel-managed...) packing with hiredis."""
    if issubclass(connection_class, HiredisPacking):
        return connection_class
    return type(f"Hiredis{connection_class.__name__}", (HiredisPacking, connection_class), {})
