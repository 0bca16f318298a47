"""Enumerations the interface lists: open ones, whose unlisted values pass, and how they are noted.

Upstream APIs and their SDKs add values to an enumeration every month (a reasoning effort, a
service tier, a harm category); a gateway that refuses a value its upstream takes breaks clients
for nothing. So an enumeration is open unless it steers the gateway itself: a string the
interface does not list passes to the upstream, which is the authority on it, and is noted in
the validation's `EnumCheck` (the validation plugin counts and logs it). A value of another type
is still refused: that is a type rule, not a list.

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


@dataclass(slots=True)
class EnumCheck:
    """What one request's validation is told and tells: whether open enumerations are closed
    (`strict`), and the (field, value) pairs it let pass that the interface does not list."""

    strict: bool = False
    unknown: list[tuple[str, str]] = field(default_factory=list)


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
        if value not in known:
            _note(info, label, value, PydanticCustomError("literal_error", "Input should be {expected}",
                                                          {"expected": expected}))
        return value

    schema = {"anyOf": [{"type": "string", "enum": list(values)}, {"type": "string"}],
              "description": f"Listed: {', '.join(values)}; another string passes to the upstream "
                             "(validation.strict_enums: refused)."}
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
        _note(info, cls.open_field, kind, ValueError(_UNKNOWN_KIND))
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


def _note(info: ValidationInfo, label: str, value: str, refusal: Exception) -> None:
    check = info.context
    if not isinstance(check, EnumCheck):
        return  # checked without a request's context: open, and nobody to tell
    if check.strict:
        raise refusal
    check.unknown.append((label, value))


def _spoken(values: tuple[str, ...]) -> str:
    """`'a', 'b' or 'c'`, as pydantic words a Literal's values."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
