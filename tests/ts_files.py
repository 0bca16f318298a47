"""A declaration file (`.d.ts`) read into a scope: its type aliases, interfaces and classes
(their properties), enums (their string values), namespaces, and what it imports and exports.
Only declarations are read; functions, constants and anything unreadable are passed over (an
alias whose type cannot be read is kept as `Unreadable`, an error only if a walk needs it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.ts_syntax import CLOSE, OPEN, TypeReader, Unreadable, unquoted


@dataclass(slots=True)
class Scope:
    """A file, a namespace in one, or a generic declaration's type parameters."""

    file: Path
    parent: Scope | None = None
    params: frozenset[str] = frozenset()
    types: dict[str, Alias | Interface | Enum] = field(default_factory=dict)
    spaces: dict[str, Scope] = field(default_factory=dict)
    imports: dict[str, tuple[Path | None, str]] = field(default_factory=dict)  # name -> (module, its name there)
    modules: dict[str, Path | None] = field(default_factory=dict)  # `import * as N`, `export * as N`
    aliases: dict[str, str] = field(default_factory=dict)  # `export { A as B }`: B -> A
    stars: list[Path | None] = field(default_factory=list)  # `export * from`


@dataclass(slots=True)
class Alias:
    type: object
    scope: Scope


@dataclass(slots=True)
class Interface:  # an interface or a class: its properties, and the types it extends
    name: str
    members: dict[str, object]
    bases: list[object]
    scope: Scope


@dataclass(slots=True)
class Enum:
    name: str
    values: dict[str, str]  # member -> its string value (numeric members have none)


def read(file: Path) -> Scope:
    """The declarations of one file; the files it imports from are named, not read."""
    scope = Scope(file)
    _FileReader(file.read_text(encoding="utf-8"), file).statements(scope)
    return scope


def module_file(importer: Path, specifier: str) -> Path | None:
    """The declaration file a relative import names; None for another package's."""
    if not specifier.startswith("."):
        return None
    base = (importer.parent / specifier).resolve()
    stem = base.with_suffix("") if base.suffix in (".js", ".mjs", ".cjs") else base
    candidates = [Path(f"{stem}.d.ts"), Path(f"{stem}.d.mts"), stem / "index.d.ts"]
    return next((c for c in candidates if c.is_file()), candidates[0])


class _FileReader(TypeReader):
    # statements

    def statements(self, scope: Scope) -> None:
        while self.kind() != "end" and self.peek() != "}":
            start = self.pos
            try:
                self.statement(scope)
            except SyntaxError:  # something these declarations need not read: past it
                self.pos = start
                while self.kind() != "end" and self.peek() not in ("{", ";"):
                    self.pos += 1
                if self.peek() == "{":
                    self.balanced()
            if self.pos == start:
                self.pos += 1

    def statement(self, scope: Scope) -> None:
        word = self.peek()
        if word == "export" and (self.peek(1) in ("{", "*", "=") or self.peek(1) == "type" and self.peek(2) == "{"):
            self.export(scope)
        elif word in ("export", "declare", "abstract", "default"):
            self.pos += 1
        elif word == "import":
            self.import_(scope)
        elif word == "type" and self.kind(1) == "name":
            self.pos += 1
            name = self.take()
            inner = self.generics(scope)
            self.take("=")
            start = self.pos
            try:
                kind = self.typed()
            except SyntaxError:
                kind = Unreadable(" ".join(t for _, t in self.toks[start : start + 40]))
                self.pos = start
            scope.types[name] = Alias(kind, inner)
            self.skip()
        elif word in ("interface", "class"):
            self.interface(scope)
        elif word == "const" and self.peek(1) == "enum" or word == "enum":
            self.pos += word == "const"
            self.enum(scope)
        elif word in ("namespace", "module") and self.kind(1) == "name":
            self.pos += 1
            space = scope
            for part in self.dotted():
                space = space.spaces.setdefault(part, Scope(scope.file, space))
            self.take("{")
            self.statements(space)
            self.take("}")
        elif word in ("module", "global"):  # `declare module 'x' {}`, `declare global {}`: augmentations
            while self.peek() != "{":
                self.take()
            self.balanced()
        else:
            self.skip()

    def import_(self, scope: Scope) -> None:
        start = self.pos
        while self.take() != "from":
            if self.kind() == "string" or self.peek() in ("=", ";"):
                self.skip()  # `import 'x'`, `import N = require('x')`
                return
        module = module_file(scope.file, unquoted(self.take()))
        words = [t for _, t in self.toks[start : self.pos]]
        if "*" in words:
            scope.modules[words[words.index("*") + 2]] = module
        for name, local in _braced(words):
            scope.imports[local] = (module, name)
        if self.peek() == ";":
            self.pos += 1

    def export(self, scope: Scope) -> None:
        """`export {A, B as C} (from 'x')`, `export * (as N) from 'x'`, `export = X`."""
        self.take("export")
        if self.peek() == "type":
            self.pos += 1
        if self.peek() == "=":
            self.skip()
            return
        start = self.pos
        if self.peek() == "*":
            self.pos += 1
            if self.peek() == "as":
                self.pos += 2
        else:
            self.balanced()
        words = [t for _, t in self.toks[start : self.pos]]
        module, named = None, self.peek() == "from"
        if named:
            self.pos += 1
            module = module_file(scope.file, unquoted(self.take()))
        if self.peek() == ";":
            self.pos += 1
        if words[0] == "*":
            if len(words) > 1:
                scope.modules[words[2]] = module
            else:
                scope.stars.append(module)
            return
        for name, exported in _braced(words):
            if named:
                scope.imports[exported] = (module, name)
            elif name != exported:
                scope.aliases[exported] = name

    def generics(self, scope: Scope) -> Scope:
        """A declaration's type parameters, as a scope its types are read in."""
        if self.peek() != "<":
            return scope
        names, depth = set(), 0
        while True:
            text = self.take()
            depth += (text in OPEN) - (text in CLOSE)
            if depth == 0:
                return Scope(scope.file, scope, frozenset(names))
            if depth == 1 and text in ("<", ",") and self.kind() == "name":
                names.add(self.peek())

    def interface(self, scope: Scope) -> None:
        self.pos += 1
        name = self.take()
        inner = self.generics(scope)
        bases = []
        while self.peek() != "{":
            if self.take() in ("extends", "implements", ","):
                bases.append(self.postfix())
        self.take("{")
        members = self.members()
        known = scope.types.get(name)
        if isinstance(known, Interface):  # declarations merge
            known.members.update(members)
            known.bases.extend(bases)
        else:
            scope.types[name] = Interface(name, members, bases, inner)

    def enum(self, scope: Scope) -> None:
        self.take("enum")
        name = self.take()
        self.take("{")
        values: dict[str, str] = {}
        while self.peek() != "}":
            member = self.take()
            if self.peek() == "=" and self.kind(1) == "string" and self.peek(2) in (",", "}"):
                values[unquoted(member) if self.kind(-1) == "string" else member] = unquoted(self.peek(1))
            self.skip((",",))
        self.take("}")
        scope.types[name] = Enum(name, values)


def _braced(words: list[str]) -> Iterator[tuple[str, str]]:
    """(name, local name) of `{ a, type b, c as d }`."""
    if "{" not in words:
        return
    inner = words[words.index("{") + 1 : words.index("}")]
    for item in " ".join(inner).split(","):
        names = [w for w in item.split() if w != "type"]
        if names:
            yield names[0], names[-1]
