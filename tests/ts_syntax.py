"""TypeScript's type syntax, as declaration files (`.d.ts`) write it, read into a few records:
string literals, references, unions, arrays, object types and indexed accesses; every other
type (a keyword, a function, a tuple, a number) is `OTHER`, which has no string values.

`TypeReader` is the token cursor with the type grammar; tests/ts_files.py reads statements with
it, tests/ts_declarations.py follows what it read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class Lit:
    value: str


@dataclass(slots=True, frozen=True)
class Ref:
    parts: tuple[str, ...]  # `Shared.Reasoning` -> ("Shared", "Reasoning")
    args: tuple[object, ...] = ()


@dataclass(slots=True, frozen=True)
class Union:
    members: tuple[object, ...]  # also an intersection: a field of either, the literals of either


@dataclass(slots=True, frozen=True)
class Arr:
    item: object


@dataclass(slots=True, frozen=True)
class Obj:
    members: dict[str, object]


@dataclass(slots=True, frozen=True)
class Index:
    of: object  # `Of['key']`
    key: object


@dataclass(slots=True, frozen=True)
class Unreadable:
    """A type this reader cannot read: an error if a walk needs it, nothing otherwise."""

    text: str


@dataclass(slots=True, frozen=True)
class Other:
    """A type with no string values: a keyword (string, null ...), a function, a tuple, a number."""


OTHER = Other()
KEYWORDS = frozenset(
    """string number boolean null undefined any unknown never object void symbol
    bigint true false this""".split()
)
MODIFIERS = frozenset("readonly public private protected static declare abstract override accessor".split())

_TOKEN = re.compile(
    r"""\s+|//[^\n]*|/\*.*?\*/
    |(?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")|(?P<template>`(?:[^`\\]|\\.)*`)
    |(?P<number>\d[\w.]*)|(?P<name>[#A-Za-z_$][\w$]*)|(?P<punct>=>|\.\.\.|\S)""",
    re.S | re.X,
)
OPEN, CLOSE = frozenset("([{<"), frozenset(")]}>")


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) pairs, comments and spaces dropped; a string keeps its quotes (`unquoted`)."""
    return [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text) if m.lastgroup is not None]


def unquoted(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


class TypeReader:
    """A cursor over a file's tokens that reads types, and the members of object types."""

    def __init__(self, text: str, where: Path) -> None:
        self.toks = [*tokens(text), ("end", "")]
        self.pos = 0
        self.where = where

    def peek(self, ahead: int = 0) -> str:
        return self.toks[min(self.pos + ahead, len(self.toks) - 1)][1]

    def kind(self, ahead: int = 0) -> str:
        return self.toks[min(self.pos + ahead, len(self.toks) - 1)][0]

    def take(self, expected: str | None = None) -> str:
        kind, text = self.toks[min(self.pos, len(self.toks) - 1)]
        if kind == "end" or (expected is not None and text != expected):
            raise SyntaxError(f"{self.where}: expected {expected!r}, found {text!r} at token {self.pos}")
        self.pos += 1
        return text

    def skip(self, stops: tuple[str, ...] = (";",)) -> None:
        """To the end of what is being read: a stop at depth 0 (taken if ';' or ','), or the
        enclosing block's close (left)."""
        depth = 0
        while self.kind() != "end":
            text = self.peek()
            if depth == 0 and (text in stops or text in (")", "]", "}")):
                if text in (";", ","):
                    self.pos += 1
                return
            depth += (text in OPEN) - (text in CLOSE)
            self.pos += 1

    def balanced(self) -> None:
        """Past a bracketed group starting here."""
        depth = 0
        while True:
            text = self.take()
            depth += (text in OPEN) - (text in CLOSE)
            if depth == 0:
                return

    def dotted(self) -> list[str]:
        parts = [self.take()]
        while self.peek() == ".":
            self.pos += 1
            parts.append(self.take())
        return parts

    def members(self) -> dict[str, object]:
        """An object type's or an interface's properties, from after its '{' past its '}'."""
        members: dict[str, object] = {}
        while self.peek() != "}":
            start = self.pos
            try:
                found = self.member()
            except SyntaxError:
                self.pos = start
                self.skip((";", ","))
                if self.pos == start:
                    raise
                continue
            if found is not None:
                name, kind = found
                members[name] = Union((members[name], kind)) if name in members else kind
            if self.peek() in (";", ","):
                self.pos += 1
        self.take("}")
        return members

    def member(self) -> tuple[str, object] | None:
        while self.peek() in MODIFIERS and self.kind(1) in ("name", "string") and self.peek(1) != "(":
            self.pos += 1
        if self.peek() in ("get", "set") and self.kind(1) in ("name", "string") and self.peek(2) == "(":
            self.skip((";", ","))  # an accessor: what a response offers, not what a request sends
            return None
        if self.peek() in ("[", "(", "<") or self.peek() == "new" and self.peek(1) in ("(", "<"):
            self.skip((";", ","))  # an index, call or construct signature, or a computed name
            return None
        name = unquoted(self.peek()) if self.kind() == "string" else self.peek()
        self.pos += 1
        if self.peek() in ("?", "!"):
            self.pos += 1
        if self.peek() != ":":
            self.skip((";", ","))  # a method, or `#private;`
            return None
        self.pos += 1
        return name, self.typed()

    # types

    def typed(self) -> object:
        kind = self.union()
        if self.peek() == "extends":  # `A extends B ? C : D`: either branch
            self.pos += 1
            self.union()
            self.take("?")
            yes = self.typed()
            self.take(":")
            return Union((yes, self.typed()))
        return kind

    def union(self) -> object:
        if self.peek() in ("|", "&"):
            self.pos += 1
        members = [self.operand()]
        while self.peek() in ("|", "&"):
            self.pos += 1
            members.append(self.operand())
        return members[0] if len(members) == 1 else Union(tuple(members))

    def operand(self) -> object:
        if self.peek() in ("keyof", "unique", "infer", "typeof", "asserts"):
            self.pos += 1
            self.operand()
            return OTHER
        if self.peek() == "readonly":
            self.pos += 1
        return self.postfix()

    def postfix(self) -> object:
        kind = self.primary()
        while self.peek() == "[":
            self.pos += 1
            if self.peek() == "]":
                self.pos += 1
                kind = Arr(kind)
            else:
                key = self.typed()
                self.take("]")
                kind = Index(kind, key)
        return kind

    def primary(self) -> object:
        kind, text = self.kind(), self.peek()
        if kind == "string":
            self.pos += 1
            return Lit(unquoted(text))
        if kind in ("number", "template") or text == "-":
            self.pos += 1 + (text == "-")
            return OTHER
        if text in ("(", "<", "new", "abstract"):
            return self.function_or_group()
        if text == "{":
            self.pos += 1
            return Obj(self.members())
        if text == "[":
            self.balanced()  # a tuple
            return OTHER
        if text == "import":  # `import('x').Y`
            self.pos += 1
            self.balanced()
            while self.peek() == ".":
                self.pos += 2
            return OTHER
        if kind != "name":
            raise SyntaxError(f"{self.where}: a type cannot start with {text!r} (token {self.pos})")
        if text in KEYWORDS and self.peek(1) != ".":
            self.pos += 1
            return OTHER
        parts = tuple(self.dotted())
        args: list[object] = []
        if self.peek() == "<":
            self.pos += 1
            while self.peek() != ">":
                args.append(self.typed())
                if self.peek() == ",":
                    self.pos += 1
            self.pos += 1
        return Ref(parts, tuple(args))

    def function_or_group(self) -> object:
        start = self.pos
        while self.peek() in ("new", "abstract"):
            self.pos += 1
        if self.peek() == "<":
            self.balanced()
        self.balanced()  # the parameters, or the group
        if self.peek() == "=>":
            self.pos += 1
            self.typed()
            return OTHER
        self.pos = start + 1
        kind = self.typed()
        self.take(")")
        return kind
