"""Reservations a generation left open (a background response, a video task): kept in the state
store under the id its answer handed out, and settled once, by the first follow-up, on any
instance, that reads how the generation ended (proxy/request/charges.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from plugins.budget.counters import Window
from proxy.core import jsonutil
from proxy.formats import Generation, Usage
from proxy.policy.prices import PriceTable
from proxy.request.charges import Most, ended

_PAST_RESET_S = 3600  # kept this long past its last window's period (settling it after is pointless)
HELD_FOR_S = 7 * 86_400  # the longest a generation's reservation waits to be settled (as the ledger's pending row)

Taken = list[tuple[list[Window], list[float]]]  # each subject's windows, and what was reserved in each


@dataclass(slots=True, frozen=True)
class Held:
    """What a generation left open holds, and what its settlement needs to know."""

    model: str | None
    most: Most
    counts_tokens: bool  # its format's answers report tokens (a video's do not)
    taken: Taken

    def dumps(self) -> str:
        return jsonutil.dumps(
            {
                "model": self.model,
                "input": self.most.input_tokens,
                "output": self.most.output_tokens,
                "seconds": self.most.video_seconds,
                "tokens": self.counts_tokens,
                "taken": [[[_fields(w) for w in windows], amounts] for windows, amounts in self.taken],
            }
        ).decode()

    @classmethod
    def loads(cls, raw: str) -> Held:
        data: dict[str, Any] = jsonutil.loads(raw)
        most = Most(data["input"], data["output"], 0, data["seconds"], 0.0)
        taken = [([Window(*fields) for fields in windows], amounts) for windows, amounts in data["taken"]]
        return cls(data["model"], most, data["tokens"], taken)

    def ttl_s(self, now: float, most_s: int) -> int:
        """How long it waits for its settlement: until its last window's period is over, at most `most_s`."""
        last_reset = max(w.resets_at for windows, _ in self.taken for w in windows)
        return max(60, min(most_s, math.ceil(last_reset - now) + _PAST_RESET_S))

    def spent(self, generation: Generation, prices: PriceTable) -> tuple[int, float]:
        """Tokens and cost the generation spent, now that it ended (as the ledger settles its row)."""
        usage, seconds, _ = ended(
            generation,
            Usage(self.most.input_tokens, self.most.output_tokens),
            self.most.video_seconds,
            self.counts_tokens,
        )
        return (usage.input_tokens or 0) + (usage.output_tokens or 0), prices.charge(
            self.model, usage, (), seconds
        ).cost


def _fields(window: Window) -> list[Any]:
    return [window.key, window.name, window.limit, window.ttl_s, window.starts_at, window.resets_at]
