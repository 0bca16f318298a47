"""What every request schema shares: extra fields allowed, tagged unions, error paths."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationError

# Union members are tagged with this mark so the tag never shows in an error path.
MARK = "\u00a7"


class Model(BaseModel):
    """A request object: fields the spec names are checked; any others are forwarded untouched."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def by_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return MARK + (kind if isinstance(kind, str) else "")


def tagged(members: dict[str, Any], pick: Callable[[Any], str] = by_type, other: Any = None) -> Any:
    """A union that checks each value against the member its tag names; `other` takes
    anything else (so new upstream types pass), or, when None, unknown tags are errors."""

    def choose(value: Any) -> str:
        tag = pick(value)
        if tag[len(MARK) :] in members:
            return tag
        return MARK + "other" if other is not None else tag

    options = [Annotated[member, Tag(MARK + name)] for name, member in members.items()]
    if other is not None:
        options.append(Annotated[other, Tag(MARK + "other")])
    return Annotated[Union[tuple(options)], Discriminator(choose)]  # noqa: UP007


def text_or(kind: Any, text: Any = str) -> Any:
    """`str` (or the string type `text`) or something else, told apart without pydantic guessing
    (clean error paths)."""
    return Annotated[
        Union[Annotated[text, Tag(MARK + "str")], Annotated[kind, Tag(MARK + "other")]],  # noqa: UP007
        Discriminator(lambda v: MARK + ("str" if isinstance(v, str) else "other")),
    ]


class AnyObject(Model):
    """An object of a kind the gateway does not check (a newer upstream type)."""


@dataclass(slots=True, frozen=True)
class Violation:
    """The first rule a request breaks: the field's path and the rule."""

    path: str
    rule: str
    status: int = 400
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}" if self.path else self.rule


def first_violation(exc: ValidationError) -> Violation:
    return violation_of(exc.errors(include_url=False, include_context=False)[0])


def violation_of(error: Any) -> Violation:
    """One pydantic error as a Violation: the path in the client's spelling, and the rule."""
    path, rule = path_of(error["loc"]), _rule(error)
    # Cross-field rules name their field first ("size: ..."): it joins the path.
    named = _NAMED_RULE.match(rule)
    if named:
        path = f"{path}.{named[1]}" if path and not named[1].startswith("[") else path + named[1]
        rule = named[2]
    return Violation(path, rule)


_NAMED_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[A-Za-z_][A-Za-z0-9_]*)*): (.+)$", re.S)


def path_of(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith(MARK) or "[" in part or part.startswith("function-")):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _rule(error: dict[str, Any]) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "missing":
        return "is required"
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return "has an unknown or missing 'type'"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return message[0].lower() + message[1:]
