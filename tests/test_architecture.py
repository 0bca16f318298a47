"""The code's boundaries, checked: the package imports and names no plugin, loads the simulator
only on demand; proxy/core/ imports nothing of the project above it; an exchange's outcome is
changed only through its named methods, by the modules named; and no module of the package or
the plugins imports itself back round a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from proxy.registry import registered

ROOT = Path(__file__).parent.parent


def _code_of(module: Path) -> ast.Module:
    return ast.parse(module.read_text(encoding="utf-8"), str(module))


def _strings(tree: ast.Module) -> list[str]:
    """String constants that are not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


# Plugin names that are also words of the wire formats or libraries, and the modules that use them as such.
WIRE_WORDS = {
    "usage": "the usage field of an answer",
    "video": "the video format's name",
    "sse": "the content format's alt=sse",
    "validation": "pydantic's validation mode",
}


def test_no_core_module_imports_or_names_a_plugin() -> None:
    names = set(registered())
    assert {"auth", "ratelimit", "url_delivery", "webhook_queue"} <= names  # the built-ins are registered
    offences = []
    for module in sorted((ROOT / "proxy").rglob("*.py")):
        tree = _code_of(module)
        where = module.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("plugins", "simulator"):
                if (node.module or "").startswith("plugins") or not _loaded_on_demand(tree, node):
                    offences.append(f"{where}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "plugins" for a in node.names):
                offences.append(f"{where}:{node.lineno} imports plugins")
            if isinstance(node, ast.Name | ast.Attribute):
                identifier = node.id if isinstance(node, ast.Name) else node.attr
                if any(n in identifier.lower() for n in ("url_delivery", "ratelimit", "webhook_queue")):
                    offences.append(f"{where}:{node.lineno} names {identifier}")
        for text in _strings(tree):
            if text in names - set(WIRE_WORDS) or any(f"plugins.{n}" in text for n in names):
                offences.append(f"{where} names {text!r}")
    assert offences == []


def _loaded_on_demand(tree: ast.Module, target: ast.AST) -> bool:
    """Whether an import runs only when called (the simulator is loaded for a config that uses
    it), or only for a type checker."""
    return any(
        target in ast.walk(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        or isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )


def test_the_core_loads_the_simulator_only_for_a_config_that_uses_it(tmp_path: Path) -> None:
    probe = textwrap.dedent("""
        import asyncio, sys
        from proxy.process.app import build_app
        from proxy.config import LoadedConfig
        from proxy.registry import parse_config

        async def main():
            config = parse_config("channels: [{name: real, base_url: 'http://127.0.0.1:9'}]", {})
            app = build_app(LoadedConfig(config, "<test>", "0"))
            print("simulator" in sys.modules)

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip() == "False", result.stderr


# What became of an exchange (proxy/core/outcome.py) is changed only through these methods of
# Outcome's, each called only from these modules.
OUTCOME_CALLERS = {
    "answered": {"proxy/request/gateway.py", "proxy/request/relay.py"},
    "sent": {"proxy/request/relay.py"},
    "stream_began": {"proxy/request/relay.py"},
    "events_sent": {"proxy/request/relay.py"},
    "failed": {"proxy/core/exchange.py", "proxy/request/gateway.py", "proxy/request/relay.py"}
    | {"proxy/request/client_guards.py"},  # the watch on a client that stopped reading
    "cut": {"proxy/request/relay.py"},
    "client_gone": {"proxy/request/relay.py"},
    "abandoned": {"proxy/request/gateway.py"},
    "attempt_started": {"proxy/request/forwarder.py"},
    "attempt_ended": {"proxy/request/forwarder.py"},
    "headers_arrived": {"proxy/request/forwarder.py"},
    "upstream_done": {"proxy/request/relay.py"},
    "paused": {"proxy/request/forwarder.py"},
    "pool_waited": {"proxy/request/forwarder.py"},  # handed to a channel's pool, which calls it
    "identified": {"plugins/usage.py", "plugins/sse.py"},  # the plugins that read answers
    "answer_whole": {"plugins/sse.py"},
}


def _project_modules() -> list[Path]:
    return sorted([*(ROOT / "proxy").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])


def _module_paths() -> dict[str, Path]:
    """Every module of the package and the plugins by its dotted name (a package by its own)."""
    paths = {}
    for path in _project_modules():
        parts = path.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def test_the_outcome_is_changed_only_through_its_named_methods_by_the_modules_named() -> None:
    from proxy.core.outcome import Outcome

    changing = {
        name
        for name, member in vars(Outcome).items()
        if callable(member) and not name.startswith("_") and name != "upstream_seconds"
    }
    assert changing == set(OUTCOME_CALLERS)  # a new method is listed here with its callers
    assigned, callers = [], {name: set() for name in OUTCOME_CALLERS}
    for module in _project_modules():
        where = str(module.relative_to(ROOT))
        for node in ast.walk(_code_of(module)):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and isinstance(part.value, ast.Attribute)
                        and part.value.attr == "outcome"
                    ):
                        assigned.append(f"{where}:{node.lineno} sets outcome.{part.attr}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in OUTCOME_CALLERS
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "outcome"
            ):
                callers[node.attr].add(where)
    assert assigned == []
    assert callers == OUTCOME_CALLERS


def test_nothing_in_the_core_imports_another_package_of_the_project() -> None:
    """proxy/core/ is the floor: the standard library, third-party libraries and itself (imports
    for annotations only aside), so every layer can stand on it and it on none of them."""
    paths = _module_paths()
    offences = [
        f"{module} imports {imported}"
        for module, path in paths.items()
        if module.startswith("proxy.core")
        for imported in _imports(module, path, set(paths))
        if not imported.startswith("proxy.core")
    ]
    assert offences == []
    assert {"exchange", "outcome", "upstream_response", "pin", "plugin", "pipeline", "runtime", "drain"} <= {
        p.stem for p in (ROOT / "proxy" / "core").glob("*.py")
    }


def _imports(module: str, path: Path, modules: set[str]) -> set[str]:
    """The project's modules `module` imports, wherever the import stands (in a function too),
    except under `if TYPE_CHECKING:` (annotations only). `from package import submodule` is an
    import of the submodule."""
    tree = _code_of(path)
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            named = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        for name in named:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def test_no_import_cycle_in_the_package_or_the_plugins_deferred_imports_counted() -> None:
    paths = _module_paths()
    graph = {module: _imports(module, path, set(paths)) for module, path in paths.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, trail: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycles.append(" -> ".join([*trail[trail.index(imported) :], imported]))
            elif imported not in state:
                walk(imported, [*trail, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []
