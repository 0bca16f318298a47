"""What a request may spend before it is answered, and when what it spent is known.

The most a request may spend (`Most`) is what budgets and token limits reserve for it: its prompt,
at four bytes of body a token, and the output it lets the upstream make (the field its format's
upstream reads, raised by any other spelling the request also carries; when it names none, the
model's own default from the price table, else the configured default), times the answers it asks
for (candidates, images with their previews, videos); its images at the dearest price its row
names, and its video seconds. Formats whose answers report no tokens (video) reserve none. Of a
form streamed through, what is known when it is asked: the fields read by then (what it names
after its files, a budget reserves once the form is whole).

Most generations end with their answer. One that goes on after it (a video task, a background
response) is `left_open`: its charge stays at its most until a follow-up (a status poll, a `GET`
of the response, a cancel) reads how it ended, and is settled then (`ended`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.core.exchange import Exchange
from proxy.formats import Generation, ImagesFormat, Usage, VideoFormat
from proxy.policy.prices import PriceTable
from proxy.wire.routes import Pin

BYTES_A_TOKEN = 4
DEFAULT_OUTPUT_TOKENS = 4096  # what a request naming no output limit is taken to make, where nothing says more


@dataclass(slots=True, frozen=True)
class Most:
    """The most one request may spend, before it is answered."""

    input_tokens: int
    output_tokens: int
    images: int
    video_seconds: float
    cost: float  # all of it priced by the table (0 for a model no row prices)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.output_tokens)


def most_of(ex: Exchange, prices: PriceTable, default_output: int, priced: bool = True) -> Most:
    """The most `ex` may spend; `default_output`: what a request naming no output limit is taken
    to let the upstream make, for a model the price table gives no `max_output_tokens`; `priced`:
    its cost is wanted too (a token limit wants none)."""
    fmt = ex.format
    asked = ex.asked()
    outputs = fmt.outputs(asked)
    input_tokens = output_tokens = 0
    if fmt.reports_usage:
        input_tokens = math.ceil(_prompt_bytes(ex) / BYTES_A_TOKEN)
        assumed = prices.default_output(ex.model) or default_output
        # A request naming no limit is held to the one it was charged for, where the gateway
        # writes the limit itself (a translation to a format that requires one): the least any
        # reservation assumed.
        ex.assumed_output = assumed if ex.assumed_output is None else min(ex.assumed_output, assumed)
        output_tokens = fmt.output_limit(asked, assumed) * outputs
    images = outputs if isinstance(fmt, ImagesFormat) else 0
    seconds = VideoFormat.seconds_made(asked)[0] if ex.route.creates is Pin.VIDEO_TASK else 0.0
    cost = prices.most(ex.model, Usage(input_tokens, output_tokens), images, seconds) if priced else 0.0
    return Most(input_tokens, output_tokens, images, seconds, cost)


def left_open(ex: Exchange) -> bool:
    """Whether the generation this request started goes on after its answer: a video task, or a
    background response its answer (or a stream cut short) did not see end, once an id for it
    was handed out."""
    if ex.created_id is None or not 200 <= ex.outcome.status < 300:
        return False
    if ex.generation is not None and ex.generation.done:
        return False
    return ex.route.creates is Pin.VIDEO_TASK or ex.format.in_background(ex.json())


def read_ended(ex: Exchange) -> Generation | None:
    """The generation a follow-up (which made none itself) read the end of, if it did: its id is
    `ex.followed_id`."""
    generation = ex.generation
    if ex.route.creates is not None or ex.followed_id is None or generation is None or not generation.done:
        return None
    return generation


def ended(generation: Generation, held: Usage, held_seconds: float, counts_tokens: bool) -> tuple[Usage, float, bool]:
    """What a generation left open spent, now that it ended: the upstream's own counts; nothing
    for one that failed; when it ended without saying (a cancelled response, say), what was held
    for it, since it may have made all it was let (marked estimated). Its video seconds are those
    held unless it failed. Returns usage, seconds and whether the usage is an estimate."""
    if generation.failed:
        return Usage(0 if counts_tokens else None, 0 if counts_tokens else None, final=True), 0.0, False
    if generation.usage is not None and generation.usage.known:
        return generation.usage, held_seconds, False
    return held, held_seconds, counts_tokens


def _prompt_bytes(ex: Exchange) -> int:
    if ex.body is not None:
        return len(ex.body)
    if ex.multipart is not None:  # a form streamed through: its text fields read so far
        return sum(len(value) for value in ex.multipart.fields().values() if isinstance(value, str))
    return 0
