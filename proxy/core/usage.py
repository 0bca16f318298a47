"""`Usage`, the tokens an upstream reported for one answer, and `Generation`, what an answer
tells of a generation that may outlive it: records every format fills in its own words' terms."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Usage:
    """Token counts an upstream reported; None where it has not said yet. In every format's
    words alike: `input_tokens` counts the whole prompt, the `cached_input_tokens` read from a
    cache among them; `output_tokens` counts all that was generated, the `reasoning_tokens`
    (thinking) among them."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    # The upstream's last word on the answer (a JSON answer's usage, a stream's closing counts),
    # not a running count or a stream's opening placeholder: what is not final may be estimated.
    final: bool = field(default=False, compare=False)

    def update(self, other: Usage) -> None:
        if other.final:
            self.final = True
        if other.input_tokens is not None:
            self.input_tokens = other.input_tokens
        if other.output_tokens is not None:
            self.output_tokens = other.output_tokens
        if other.cached_input_tokens is not None:
            self.cached_input_tokens = other.cached_input_tokens
        if other.reasoning_tokens is not None:
            self.reasoning_tokens = other.reasoning_tokens

    @property
    def known(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None


@dataclass(slots=True, frozen=True)
class Generation:
    """What an answer tells of a generation that may outlive it (a background response, a video
    task): whether it has ended, and once it has, what the upstream reported it spent (`usage`;
    None: it did not say) and whether it ended having made nothing it bills (`failed`)."""

    done: bool
    usage: Usage | None = None
    failed: bool = False
