"""What a request used, when the upstream never said all of it: a stream cut short (the client
left, the upstream broke off), a client that left before a buffered answer came.

The upstream's own counts are kept; what it had not said is estimated: the prompt at four bytes of
request body a token, the output at one token an event that reached the client (an upstream sends
about one a delta event). A count below the events streamed, like the placeholder a message
stream starts with, is one the upstream never finished. A request the upstream was never sent, or
that it refused, used nothing.
"""

from __future__ import annotations

import math

from proxy.formats import Usage
from proxy.request.exchange import Exchange

_BYTES_A_TOKEN = 4


def usage_or_estimate(ex: Exchange) -> tuple[Usage, bool]:
    """The request's usage, and whether any figure of it is an estimate."""
    usage, outcome = ex.usage, ex.outcome
    events = outcome.events
    refused = outcome.status >= 400 and not outcome.streamed
    if not ex.format.reports_usage or outcome.upstream_started is None or refused:
        return usage, False
    cut_short = outcome.streamed and (outcome.client_aborted or outcome.error is not None)
    left_waiting = not outcome.streamed and outcome.client_aborted and not usage.known
    if not cut_short and not left_waiting:
        return usage, False
    estimate = Usage(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)
    if estimate.input_tokens is None:
        estimate.input_tokens = math.ceil(len(ex.body or b"") / _BYTES_A_TOKEN)
    if estimate.output_tokens is None or estimate.output_tokens < events:
        estimate.output_tokens = events
    return estimate, estimate != usage
