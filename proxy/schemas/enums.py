"""Enumerations the interface lists: open ones, whose unlisted values pass, and how they are noted.

Upstream APIs and their SDKs add values to an enumeration every month (a reasoning effort, a
harm category, a function-calling mode); a gateway that refuses a value its upstream takes breaks clients
for nothing. So an enumeration is open unless it steers the gateway itself: a string the
interface does not list passes to the upstream, which is the authority on it, and is noted in
the validation's `EnumCheck` (the validation plugin counts and logs it). A value of another type
is still refused: that is a type rule, not a list.

A client chooses how many values it sends (ten million in one body's `include`), so the work per
value is kept to what a plain string costs plus one Python call: a listed value is one set
lookup; an unlisted one adds to its field's count, and the first few distinct ones are kept for
the log. Past `MOST_UNLISTED` in one request the plugin refuses it: no SDK sends that many.

Closed enumerations stay `Literal`s in the schemas, each with its reason written beside it: the
ones that change routing (a model list), billing (what charges read) or what the gateway does
(a URL-delivery switch). With `validation.strict_enums` every open one is closed again, as the
interface lists it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, ValidationInfo, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from proxy.schemas.common import AnyObject, by_type, tagged

# Why a field is open, as the schemas say beside each: the gateway neither routes, bills nor acts
# by its value, and the upstream, which does, is the authority on what it takes.
UPSTREAMS = "the upstream's to judge: the gateway neither routes, bills nor acts by it"
# Every open field's label, as the metric and the log name it: a bounded set, fixed at import.
OPEN_FIELDS: set[str] = set()
_UNKNOWN_KIND = "has an unknown or missing 'type'"
# Unlisted values one request may carry, all fields together: a client SDK sends a handful (a
# newer effort, a harm category or two); a body with more is refused (docs/security.md, "Bounds").
MOST_UNLISTED = 256
# Distinct (field, value) pairs one request keeps for the log; the rest are only counted.
KEPT_PER_REQUEST = 16


@dataclass(slots=True)
class EnumCheck:
    """What one request's validation is told and tells: whether open enumerations are closed
    (`strict`), and what it let pass that the interface does not list: how many values by field
    (`counts`, keyed by labels from the schemas, so bounded), all fields together (`total`), and
    the first `KEPT_PER_REQUEST` distinct (field, value) pairs (`kept`, in order). Counting stops
    one past `MOST_UNLISTED`: such a request is refused."""

    strict: bool = False
    # The beta features the request asks for (msgapi-beta, anthropic-beta): some lift a rule (a
    # thinking budget past max_tokens, with interleaved thinking).
    betas: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    kept: dict[tuple[str, str], None] = field(default_factory=dict)

    def noted(self, label: str, value: str) -> None:
        """One unlisted value of the field `label`: counted, and kept while there is room."""
        self.total += 1
        counts = self.counts
        counts[label] = counts.get(label, 0) + 1
        if len(self.kept) < KEPT_PER_REQUEST:
            self.kept[(label, value)] = None

    def over_bound(self) -> str | None:
        """When the request carries more than `MOST_UNLISTED` unlisted values, the field with
        the most of them (a request's error names one field); else None."""
        if self.total <= MOST_UNLISTED:
            return None
        return max(self.counts, key=self.counts.__getitem__)


@dataclass(slots=True, frozen=True)
class OpenEnum:
    """The mark of an open enumeration in a field's type: its label, the values the interface
    lists, and why it is open."""

    field: str
    values: tuple[str, ...]
    why: str


def open_enum(label: str, values: tuple[str, ...], why: str) -> Any:
    """A string field whose listed `values` are known and any other string passes (noted), or,
    under `strict_enums`, is refused as a `Literal` would refuse it."""
    mark = OpenEnum(label, values, why)
    known = frozenset(values)
    expected = _spoken(values)
    OPEN_FIELDS.add(label)

    def known_or_noted(value: str, info: ValidationInfo) -> str:
        # Called for every value of the field, a list's too: a listed one costs a set lookup, and
        # an unlisted one past the bound a comparison (the request is refused: nothing to note).
        if value in known:
            return value
        check = info.context
        # Without a request's context (a schema check of its own) nobody is told.
        if type(check) is EnumCheck and check.total <= MOST_UNLISTED:
            if check.strict:
                raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
            check.noted(label, value)
        return value

    schema = {
        "anyOf": [{"type": "string", "enum": list(values)}, {"type": "string"}],
        "description": f"Listed: {', '.join(values)}; another string passes to the upstream "
        "(validation.strict_enums: refused).",
    }
    return Annotated[str, AfterValidator(known_or_noted), mark, WithJsonSchema(schema)]


class OpenKind(AnyObject):
    """An object of a tagged union whose `type` the gateway does not know: passed and noted, or
    refused under `strict_enums` (subclasses name the union's label and its known types)."""

    open_field: ClassVar[str] = ""
    known: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _noted(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value  # the model's own check says it is no object
        kind = value.get("type")
        if not isinstance(kind, str):  # missing, or not a string: the type rule, open or not
            raise ValueError(_UNKNOWN_KIND)
        check = info.context
        if type(check) is EnumCheck and check.total <= MOST_UNLISTED:  # as open_enum's check does
            if check.strict:
                raise ValueError(_UNKNOWN_KIND)
            check.noted(cls.open_field, kind)
        return value


def open_kinds(name: str, label: str, known: tuple[str, ...], why: str) -> type[OpenKind]:
    """The `other` member, called `name`, of a tagged union (proxy.schemas.common.tagged) whose
    types are open; `known` are the types its other members take."""
    OPEN_FIELDS.add(label)
    return type(name, (OpenKind,), {"open_field": label, "known": known, "__doc__": why, "__module__": __name__})


def open_tagged(members: dict[str, Any], name: str, label: str, why: str, pick: Any = by_type) -> Any:
    """A tagged union (proxy.schemas.common.tagged) whose known types are checked in full and any
    other type passes, noted (`label` names its `type` field)."""
    return tagged(members, pick, other=open_kinds(name, label, tuple(members), why))


def _spoken(values: tuple[str, ...]) -> str:
    """`'a', 'b' or 'c'`, as pydantic words a Literal's values."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
