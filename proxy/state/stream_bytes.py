"""Redis streams bounded by the bytes they hold, not by their entries: what one entry takes can
differ a thousandfold (a webhook's body, a usage record's model name), so a count bounds nothing.

A counter beside each stream holds the bytes of its entries as stored (every field name and
value), moved by the same script that adds or removes an entry, so it is exact across instances
and a bound checked against it holds without a race. `LUA` is the prelude those scripts start
with:

- `size(fields, from)`: the bytes of a flat list of field names and values (from index `from`);
- `held(stream, counter)`: the bytes the stream holds. A stream with no entries holds none (a
  count left wrong by a writer that does not count, an older release during an upgrade, mends
  itself there); a counter missing beside entries (a stream written before there were counters)
  is seeded from Redis's own estimate of the stream's memory, which errs high, until it empties;
- `add(stream, counter, fields, from)`: XADD the fields and count them; the new entry's id;
- `remove(stream, counter, id)`: XDEL an entry and uncount it; false when it was not there
  (removed already, by another instance), so nothing is uncounted twice.

On a Cluster a script's keys must share a slot: `beside(key)` names a counter in its stream's
slot, for a stream whose name has no hash tag of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

LUA = """
local function size(fields, from)
  local n = 0
  for i = from or 1, #fields do n = n + #fields[i] end
  return n
end
local function held(stream, counter)
  if redis.call('XLEN', stream) == 0 then
    if redis.call('GET', counter) ~= '0' then redis.call('SET', counter, 0) end
    return 0
  end
  local known = redis.call('GET', counter)
  if known then return tonumber(known) end
  local guess = redis.call('MEMORY', 'USAGE', stream) or 0
  redis.call('SET', counter, guess)
  return guess
end
local function add(stream, counter, fields, from)
  local n = size(fields, from)
  held(stream, counter)
  local id = redis.call('XADD', stream, '*', unpack(fields, from))
  redis.call('INCRBY', counter, n)
  return id
end
local function remove(stream, counter, id)
  local found = redis.call('XRANGE', stream, id, id)
  if #found == 0 then return false end
  held(stream, counter)
  redis.call('XDEL', stream, id)
  if redis.call('XLEN', stream) == 0 or redis.call('DECRBY', counter, size(found[1][2])) < 0 then
    redis.call('SET', counter, 0)
  end
  return true
end
"""


def beside(key: str) -> str:
    """The byte counter of the stream `key` (a name without braces), in the same Cluster slot: its
    hash tag is the stream's whole name, which is what the stream's own slot is hashed from."""
    return "{" + key + "}:bytes"


async def run(client: Any, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """A registered script by its digest, else by its text, on the node holding `keys`: redis-py
    would load a script Redis forgot on every primary of a Cluster, failing while any one is down."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(script.script, len(keys), *keys, *args)
