"""The request types of the installed openai, anthropic and google-genai SDKs, read as data: every
value an SDK can put in a field the gateway checks as an enumeration goes through the gateway,
and none gets a 400 (nor a 5xx) unless a hard rule of the interface refuses it, named in the
table of fields (tests/sdk_fields.py, which tests/test_js_sdk_types.py reads the JavaScript SDKs by).

The gateway's enumeration fields are found by walking its request schemas (Literals, open
enumerations, tagged unions), so a new one in a schema fails this test until it is mapped to the
SDK type that sends it. When an SDK adds a value, the send test says so before a user does."""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag

from proxy.schemas import JSON_SCHEMAS, ImageEditForm
from proxy.schemas.common import MARK
from proxy.schemas.enums import OpenEnum, OpenKind
from tests.sdk_fields import CHECKED_IN_VALIDATORS, CONFIG, MADE_UP, MAPPING, Sdk, refusals, sdk_values

# -- the gateway's enumeration fields, from its schemas --


@dataclass(frozen=True)
class Enumeration:
    values: tuple[Any, ...]
    label: str | None  # an open enumeration's label; None: closed


def gateway_enumerations() -> dict[str, Enumeration]:
    """Every field the request schemas check against a list of values, as "route:path"; a field
    of a model used in several places once, where the walk meets it first."""
    roots: dict[type[BaseModel], str] = {}
    for route, schema in JSON_SCHEMAS.items():
        roots.setdefault(schema, route)
    roots.setdefault(ImageEditForm, "image_edits")
    found: dict[str, Enumeration] = {}
    owners: set[tuple[Any, ...]] = set()
    for schema, route in roots.items():
        _model(schema, f"{route}:", (), False, found, owners)
    return found


def _model(
    model: type[BaseModel],
    path: str,
    ancestors: tuple[type, ...],
    member: bool,
    found: dict[str, Enumeration],
    owners: set[tuple[Any, ...]],
) -> None:
    if model in ancestors:
        return  # a recursive schema (responseSchema.items ...): its fields were walked already
    for name, info in model.model_fields.items():
        if member and name == "type":
            continue  # a tagged union's tag: the union is the enumeration
        owner = next(c for c in model.__mro__ if name in c.__dict__.get("__annotations__", {}))
        kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        place = f"{path}{'' if path.endswith(':') else '.'}{info.alias or name}"
        _walk(kind, place, (*ancestors, model), (owner, name), found, owners)


def _walk(
    kind: Any,
    path: str,
    ancestors: tuple[type, ...],
    origin: tuple[Any, ...],
    found: dict[str, Enumeration],
    owners: set[tuple[Any, ...]],
) -> None:
    def record(where: str, values: tuple[Any, ...], label: str | None, why: tuple[Any, ...]) -> None:
        if why not in owners:
            owners.add(why)
            found[where] = Enumeration(values, label)

    origin_type = get_origin(kind)
    if origin_type is Annotated:
        inner, *marks = get_args(kind)
        if (mark := next((m for m in marks if isinstance(m, OpenEnum)), None)) is not None:
            record(path, mark.values, mark.field, origin)
        elif any(isinstance(m, Discriminator) for m in marks):
            _tagged(inner, path, ancestors, origin, found, owners, record)
        else:
            _walk(inner, path, ancestors, origin, found, owners)
    elif origin_type in (Union, types.UnionType):
        for arg in get_args(kind):
            _walk(arg, path, ancestors, origin, found, owners)
    elif origin_type is list:
        _walk(get_args(kind)[0], path + "[]", ancestors, origin, found, owners)
    elif origin_type is dict:
        _walk(get_args(kind)[1], path + "{}", ancestors, origin, found, owners)
    elif origin_type is Literal:
        record(path, get_args(kind), None, origin)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        record(path, tuple(m.value for m in kind), None, origin)
    elif isinstance(kind, type) and issubclass(kind, BaseModel):
        _model(kind, path, ancestors, False, found, owners)


def _tagged(
    union: Any,
    path: str,
    ancestors: tuple[type, ...],
    origin: tuple[Any, ...],
    found: dict[str, Enumeration],
    owners: set[tuple[Any, ...]],
    record: Any,
) -> None:
    members: dict[str, Any] = {}
    for arg in get_args(union):
        inner, *marks = get_args(arg)  # nested Annotated flattens: the member's own marks are here too
        tag = next(m.tag for m in marks if isinstance(m, Tag))
        own = [m for m in marks if not isinstance(m, Tag)]
        members.setdefault(tag.removeprefix(MARK), Annotated[(inner, *own)] if own else inner)
    if set(members) == {"str", "other"}:  # proxy.schemas.common.text_or: a string or something else
        for inner in members.values():
            _walk(inner, path, ancestors, origin, found, owners)
        return
    other = members.pop("other", None)
    if other is None or issubclass(other, OpenKind):  # closed, or open and noted: an enumeration
        record(path + ".type", tuple(members), other.open_field if other else None, (*origin, "type"))
    for tag, member in members.items():
        if isinstance(member, type) and issubclass(member, BaseModel):
            _model(member, f"{path}({tag})", ancestors, True, found, owners)


# -- the tests --


def test_every_enumeration_the_gateway_checks_is_mapped_to_the_sdk_types_that_send_it():
    walked = gateway_enumerations()
    assert sorted(set(walked) - set(MAPPING)) == [], "map each new enumeration field to its SDK type"
    assert sorted(set(MAPPING) - set(walked)) == [], "a mapped field the schemas no longer check"
    for key, case in {**MAPPING, **CHECKED_IN_VALIDATORS}.items():
        if isinstance(case.source, Sdk):
            values = sdk_values(case.source)
            assert values, f"{key}: {case.source.kind} has no enumeration at {case.source.path}"
            assert set(case.source.beyond) <= values, f"{key}: a refused value the SDK no longer has"
        elif walked.get(key) and walked[key].label is None:
            assert case.source.why, key  # a closed list no SDK sends says why it is closed


def test_the_walk_sees_open_closed_and_tagged_enumerations():
    walked = gateway_enumerations()
    assert walked["responses:reasoning.effort"] == Enumeration(("low", "medium", "high"), "reasoning.effort")
    assert walked["image_generations:response_format"] == Enumeration(("url", "b64_json"), None)
    assert walked["messages:tool_choice.type"].values == ("auto", "any", "tool", "none")
    assert "messages:messages[].content[].type" not in walked  # open to any block type, noted nowhere


async def test_every_value_the_sdks_can_send_passes_the_gateway(start_gateway, http, tmp_path):
    gw = await start_gateway(CONFIG % (tmp_path / "images"))
    walked = gateway_enumerations()
    wrong: list[str] = []
    sent = 0
    for key, case in {**MAPPING, **CHECKED_IN_VALIDATORS}.items():
        if isinstance(case.source, Sdk):
            values, beyond = sorted(sdk_values(case.source)), case.source.beyond
        elif walked[key].label is not None:
            values, beyond = [MADE_UP], {}  # open, with no SDK list: anything passes
        else:
            continue  # closed, and no SDK sends it: the reason is in the mapping
        wrong += await refusals(http, gw.url, key, case, values, beyond)
        sent += len(values)
    assert wrong == []
    assert sent > 150  # every SDK's lists, not a few
