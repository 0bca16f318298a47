"""`${VAR}` and `${VAR:-default}` substitution in config values, with the key path of every failure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# `$${` is the escape for a literal `${`.
_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")


def expand(tree: Any, environ: Mapping[str, str], path: str = "") -> tuple[Any, list[str]]:
    """Return `tree` with references expanded, and one problem line per unresolved reference."""
    problems: list[str] = []
    return _expand(tree, environ, path, problems), problems


def _expand(node: Any, environ: Mapping[str, str], path: str, problems: list[str]) -> Any:
    if isinstance(node, str):
        return _expand_string(node, environ, path, problems)
    if isinstance(node, dict):
        return {k: _expand(v, environ, _join(path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand(v, environ, f"{path}[{i}]", problems) for i, v in enumerate(node)]
    return node


def _expand_string(text: str, environ: Mapping[str, str], path: str, problems: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default, malformed = match.group(1), match.group(2), match.group(3)
        if name is None:
            problems.append(f"{path or '<root>'}: malformed variable reference '${{{malformed}'")
            return ""
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{path or '<root>'}: undefined variable {name} (set it, or give a default: ${{{name}:-value}})")
        return ""

    return _REFERENCE.sub(replace, text) if "$" in text else text


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
