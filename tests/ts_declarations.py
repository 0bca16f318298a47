"""A reader of TypeScript declaration files (`.d.ts`) for the string values a field may take.

The JavaScript SDKs say what a request may carry in their declarations: string-literal unions
(`type ReasoningEffort = 'low' | 'high' | null`) and enums (`enum HarmCategory { X = "X" }`),
reached through interfaces, classes, namespaces, aliases, arrays and imports across files.
`Declarations(node_modules).values(file, "Type", "field.sub[].kind")` follows them as the
compiler would, enough for request types; node is not needed. (tests/ts_syntax.py reads types,
tests/ts_files.py a file's declarations.)

It reads loudly: a file, a name or a property it cannot find is an `Unresolved` error (a
renamed type must not read as "no values"), as is a name used inside the types it walks that is
neither declared, imported, a type parameter nor a built-in. A name imported from another
package (`'google-auth-library'`) is foreign: it has no values here and is no error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from tests.ts_files import Alias, Enum, Interface, Scope, read
from tests.ts_syntax import Arr, Index, Lit, Obj, Ref, Union, Unreadable


class Unresolved(LookupError):
    """A file, name or property the declarations do not have."""


FOREIGN = object()  # a name another package, a type parameter or the language itself declares
# The language's and the runtime's names the SDKs' declarations use without importing them.
GLOBALS = frozenset(
    """Record Partial Required Readonly Pick Omit Exclude Extract NonNullable Promise
    PromiseLike Date Blob File Uint8Array ArrayBuffer ArrayBufferView DataView Map Set WeakMap Error
    Response Request Headers HeadersInit RequestInit AbortSignal ReadableStream Buffer URL FormData
    Awaited ReturnType Parameters Function Object String Number Boolean Symbol AsyncIterable
    AsyncIterator AsyncGenerator Iterator IterableIterator Generator NodeJS BodyInit""".split()
)
_ARRAYS = frozenset({"Array", "ReadonlyArray", "Iterable", "Set"})
_SAME_SHAPE = frozenset({"Partial", "Required", "Readonly", "Pick", "Omit", "NonNullable"})


class Declarations:
    """The declarations under a node_modules folder, each file read once, when first needed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[Path, Scope] = {}

    def values(self, file: str, name: str, path: str = "") -> set[str]:
        """The strings the type `name` of `file` (under the root) may be at `path`: its
        properties by name, `[]` an array's items, as tests/sdk_fields.py writes paths."""
        module = self.module(self.root / file)
        kinds: list[tuple[object, Scope]] = [(Ref(tuple(name.split("."))), module)]
        walked = name
        for step in [s for s in path.replace("[]", ".[]").split(".") if s]:
            kinds = [found for kind, scope in kinds for found in self.step(kind, scope, step)]
            walked += step if step == "[]" else f".{step}"
            if not kinds:
                raise Unresolved(f"{file}: {walked}: no such property")
        return {value for kind, scope in kinds for value in self.literals(kind, scope)}

    def module(self, file: Path) -> Scope:
        if file not in self.files:
            if not file.is_file():
                raise Unresolved(f"no declaration file {file}")
            self.files[file] = read(file)
        return self.files[file]

    def step(self, kind: object, scope: Scope, step: str) -> Iterator[tuple[object, Scope]]:
        for shape, where in self.expand(kind, scope):
            if step == "[]" and isinstance(shape, Arr):
                yield shape.item, where
            elif isinstance(shape, Obj) and step in shape.members:
                yield shape.members[step], where
            elif isinstance(shape, Interface):
                yield from self.property(shape, step, set())

    def property(self, shape: Interface, name: str, seen: set[int]) -> Iterator[tuple[object, Scope]]:
        """An interface's property: its own, or else its bases'."""
        if id(shape) in seen:
            return
        seen.add(id(shape))
        if name in shape.members:
            yield shape.members[name], shape.scope
            return
        for base in shape.bases:
            for found in self.expand(base, shape.scope):
                match found:
                    case (Interface() as inner, _):
                        yield from self.property(inner, name, seen)
                    case (Obj(members), where) if name in members:
                        yield members[name], where

    def literals(self, kind: object, scope: Scope) -> set[str]:
        out: set[str] = set()
        for shape, _ in self.expand(kind, scope):
            if isinstance(shape, Lit):
                out.add(shape.value)
            elif isinstance(shape, Enum):
                out.update(shape.values.values())
        return out

    def expand(self, kind: object, scope: Scope, depth: int = 0) -> Iterator[tuple[object, Scope]]:
        """`kind` with unions opened and references followed: literals, arrays, objects,
        interfaces and enums (and others, which have no values)."""
        if isinstance(kind, Unreadable):
            raise Unresolved(f"{scope.file}: a type this reader cannot read: {kind.text}")
        if depth > 64:
            raise Unresolved(f"{scope.file}: a type refers to itself without end: {kind}")
        if isinstance(kind, Union):
            for member in kind.members:
                yield from self.expand(member, scope, depth + 1)
        elif isinstance(kind, Index):
            for key in self.literals(kind.key, scope):
                for found, where in self.step(kind.of, scope, key):
                    yield from self.expand(found, where, depth + 1)
        elif isinstance(kind, Ref) and len(kind.parts) == 1 and kind.args and kind.parts[0] in _ARRAYS:
            yield Arr(kind.args[0]), scope
        elif isinstance(kind, Ref) and len(kind.parts) == 1 and kind.args and kind.parts[0] in _SAME_SHAPE:
            yield from self.expand(kind.args[0], scope, depth + 1)
        elif isinstance(kind, Ref):
            found = self.named(kind.parts, scope)
            if isinstance(found, Alias):
                yield from self.expand(found.type, found.scope, depth + 1)
            elif found is not FOREIGN:
                yield found, scope
        else:
            yield kind, scope

    def named(self, parts: tuple[str, ...], scope: Scope) -> object:
        """What a (dotted) name means where it is used: a declaration, an enum member's literal,
        or FOREIGN."""
        if len(parts) == 1:
            found = self.lookup(parts[0], scope, self.typed_in)
        else:
            found = self.lookup(parts[0], scope, self.space_in)
            for part in parts[1:-1]:
                found = self.space_in(found, part, set()) if found is not FOREIGN else FOREIGN
            if isinstance(found, Enum):
                if parts[-1] not in found.values:
                    raise Unresolved(f"{scope.file}: {'.'.join(parts)}: no such string member")
                return Lit(found.values[parts[-1]])
            if isinstance(found, Scope):
                found = self.typed_in(found, parts[-1], set())
        if found is None:
            raise Unresolved(f"{scope.file}: {'.'.join(parts)} is declared nowhere it can see")
        return found

    def lookup(self, name: str, scope: Scope, within: Callable[[Scope, str, set[tuple[Path, str]]], object]) -> object:
        """A name from where it is used outwards; a built-in's name last."""
        here: Scope | None = scope
        while here is not None:
            if name in here.params:
                return FOREIGN
            found = within(here, name, set())
            if found is not None:
                return found
            here = here.parent
        return FOREIGN if name in GLOBALS else None

    def typed_in(self, scope: Scope, name: str, seen: set[tuple[Path, str]]) -> object:
        """A type (alias, interface, class or enum) `scope` declares, imports or exports as `name`."""
        return self.declared(scope, name, seen, lambda s, n: s.types.get(n), self.typed_in)

    def space_in(self, scope: object, name: str, seen: set[tuple[Path, str]]) -> object:
        """A namespace, module or enum `scope` has as `name` (to read `name.Member` in)."""
        if not isinstance(scope, Scope):
            return None

        def own(s: Scope, n: str) -> object:
            if n in s.modules:
                return FOREIGN if s.modules[n] is None else self.module(s.modules[n])
            enum = s.types.get(n)
            return s.spaces.get(n) or (enum if isinstance(enum, Enum) else None)

        return self.declared(scope, name, seen, own, self.space_in)

    def declared(
        self,
        scope: Scope,
        name: str,
        seen: set[tuple[Path, str]],
        own: Callable[[Scope, str], object],
        again: Callable[[Scope, str, set[tuple[Path, str]]], object],
    ) -> object:
        """What `scope` has as `name`: its `own`, or what it renames, imports or re-exports, looked
        up `again` in the scope that has it."""
        if (scope.file, name) in seen:
            return None
        seen.add((scope.file, name))
        found = own(scope, name)
        if found is not None:
            return found
        if name in scope.aliases:  # `export { A as B }`: A as seen from here (a namespace sees its file)
            return self.lookup(scope.aliases[name], scope, again)
        if name in scope.imports:
            module, there = scope.imports[name]
            return FOREIGN if module is None else again(self.module(module), there, seen)
        for module in scope.stars:
            if module is not None and (found := again(self.module(module), name, seen)) is not None:
                return found
        return None
