"""`phase`: a named step of one request's work, as observability sees it.

Every step the core times for a trace (each plugin hook, each upstream attempt) is written once,
inside `with phase(ex, name):`. A traced request gets a child span of its own for the step, which
records an exception leaving it; an untraced one gets a shared no-op context and nothing else:
no object is made, so tracing off costs the request path one attribute read per step. The
tracer is whatever the observability layer put on the exchange (`Exchange.tracer`, which has a
`phase` of its own): the core names no tracing library.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.core.exchange import Exchange

_UNTRACED: AbstractContextManager[None] = nullcontext()


class PhaseTracer(Protocol):
    """What a tracer put on an exchange offers: a span for one step, a child of the request's,
    ended when the block ends (`kind`: "internal", or "client" for a call to an upstream)."""

    def phase(
        self, ex: Exchange, name: str, kind: str, attributes: dict[str, Any] | None
    ) -> AbstractContextManager[Any]: ...


def phase(
    ex: Exchange, name: str, kind: str = "internal", attributes: dict[str, Any] | None = None
) -> AbstractContextManager[Any]:
    """The step `name` of `ex`'s work: a span when the request is traced (what `as` gives), else
    nothing (`as` gives None)."""
    if ex.span is None:
        return _UNTRACED
    tracer: PhaseTracer = ex.tracer
    return tracer.phase(ex, name, kind, attributes)
