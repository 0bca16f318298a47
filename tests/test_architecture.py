"""The code's boundaries, checked: the core imports and names no plugin, loads the simulator
only on demand, and only the forwarder, the relay and the gateway write an exchange's outcome."""

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
        from proxy.config import LoadedConfig, parse_config

        async def main():
            config = parse_config("channels: [{name: real, base_url: 'http://127.0.0.1:9'}]", {})
            app = build_app(LoadedConfig(config, "<test>", "0"))
            print("simulator" in sys.modules)

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip() == "False", result.stderr


# Who writes what became of an exchange (proxy/request/exchange.py, Outcome).
OUTCOME_WRITERS = {
    "proxy/request/forwarder.py",
    "proxy/request/relay.py",
    "proxy/request/gateway.py",
    "proxy/request/exchange.py",
    "proxy/request/client_limits.py",
}  # the relay's watch on a client that stopped reading


def test_only_the_forwarder_the_relay_and_the_gateway_write_the_outcome() -> None:
    writers = set()
    for module in sorted([*(ROOT / "proxy").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        for node in ast.walk(_code_of(module)):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Attribute)
                    and target.value.attr == "outcome"
                ):
                    writers.add(str(module.relative_to(ROOT)))
    assert writers <= OUTCOME_WRITERS and {"proxy/request/forwarder.py", "proxy/request/relay.py"} <= writers
