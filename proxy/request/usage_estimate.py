"""What a request used, when the upstream never said all of it: a stream cut short (the client
left, the upstream broke off, the gateway stopped), a stream that ended without its closing
counts, a client that left before a buffered answer came, a whole answer that said nothing.

The upstream's own counts are kept; what it had not said is estimated: the prompt at four bytes
of request body a token, the output at one token an event the gateway wrote to the client (an
upstream sends about one a delta event). A count that is not the upstream's last word (a running count, the
placeholder a message stream starts with) is no more than an estimate either: it is raised to the
events streamed, and the whole is marked estimated. A whole successful answer without its usage
is charged what was held for it (its most: it may have made all it was let), and so is a
background generation whose client left before its id was handed out (it runs on upstream, and
nothing can read how it ended). A request the upstream was never sent, or that it refused, used
nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from proxy.core.exchange import Exchange
from proxy.formats import Usage
from proxy.request.charges import BYTES_A_TOKEN


def usage_or_estimate(ex: Exchange, held: Callable[[], Usage] | None = None) -> tuple[Usage, bool]:
    """The request's usage, and whether any figure of it is an estimate; `held`: what was held for
    it (asked only for a whole answer that said nothing of its usage, or a background generation
    whose id never went out)."""
    usage, outcome = ex.usage, ex.outcome
    if not ex.format.reports_usage or outcome.upstream_started is None or usage.final:
        return usage, False
    if (
        held is not None
        and ex.created_id is None
        and (outcome.status < 300 or outcome.client_aborted)
        and ex.format.in_background(ex.json())
    ):
        return held(), True  # it runs on upstream, and no id was handed out to read how it ends by
    if outcome.streamed:
        unsaid = outcome.status < 400  # cut short, or ended without its closing counts
    elif outcome.client_aborted:  # a client gone before its answer came: the upstream had its prompt, at least
        unsaid = True
    else:  # a whole answer: a success that said nothing of what it cost is charged what was held
        return (held(), True) if held is not None and 200 <= outcome.status < 300 else (usage, False)
    if not unsaid:
        return usage, False
    estimate = Usage(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens)
    if estimate.input_tokens is None:
        estimate.input_tokens = math.ceil(len(ex.body or b"") / BYTES_A_TOKEN)
    if estimate.output_tokens is None or estimate.output_tokens < outcome.events:
        estimate.output_tokens = outcome.events
    return estimate, True
