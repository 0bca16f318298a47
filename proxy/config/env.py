"""References in config values: `${VAR}`, `${VAR:-default}` and `${file:/path}`, expanded with the
key path of every failure; and placeholders left unedited.

`${file:/path}` is how secrets come from a mounted volume (a Kubernetes Secret, a Docker secret):
the file's text with one trailing newline removed, read at every load, so a reload (a signal, or
the watcher in proxy/process/watch.py) takes a rotated secret. An empty file is refused. What a
file holds is never put in a problem line, only its path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from proxy.config.files import MAX_SECRET_BYTES, UnreadableFile, digest, read_file

# `$${` is the escape for a literal `${`.
_REFERENCE = re.compile(r"\$\$\{|\$\{file:([^}]*)\}|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")

# What the shipped deploy files put where a value of the operator's own must go: a gateway that
# started on it would fail later and less clearly (a credential the upstream refuses), or not at
# all (a key anyone who read the files knows), so a value holding it is a problem.
PLACEHOLDER = "CHANGE-ME"
PLACEHOLDER_PROBLEM = f"the placeholder {PLACEHOLDER} is still in"


def expand(
    tree: Any, environ: Mapping[str, str], path: str = "", files: MutableMapping[str, str | None] | None = None
) -> tuple[Any, list[str]]:
    """Return `tree` with references expanded, and one problem line per unresolved reference.

    Each file read is recorded in `files` (its path, and the digest of what it held, or None when
    it could not be read), so the files a config depends on can be watched for changes."""
    problems: list[str] = []
    return _expand(tree, environ, path, problems, {} if files is None else files), problems


def _expand(
    node: Any, environ: Mapping[str, str], path: str, problems: list[str], files: MutableMapping[str, str | None]
) -> Any:
    if isinstance(node, str):
        return _expand_string(node, environ, path, problems, files)
    if isinstance(node, dict):
        return {k: _expand(v, environ, _join(path, str(k)), problems, files) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand(v, environ, f"{path}[{i}]", problems, files) for i, v in enumerate(node)]
    return node


def _expand_string(
    text: str, environ: Mapping[str, str], path: str, problems: list[str], files: MutableMapping[str, str | None]
) -> str:
    where = path or "<root>"
    placeholders: list[str] = []  # where each placeholder came from, for the problem line

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        file, name, default, malformed = match.group(1), match.group(2), match.group(3), match.group(4)
        if file is not None:
            value = _read_secret(file, where, problems, files)
            if value is not None and PLACEHOLDER in value:
                placeholders.append(f"the file {file}")
            return value or ""
        if name is None:
            problems.append(f"{where}: malformed variable reference '${{{malformed}'")
            return ""
        if name in environ:
            if PLACEHOLDER in environ[name]:
                placeholders.append(f"the variable {name}")
            return environ[name]
        if default is not None:
            if PLACEHOLDER in default:
                placeholders.append(f"the default of {name}")
            return default
        problems.append(f"{where}: undefined variable {name} (set it, or give a default: ${{{name}:-value}})")
        return ""

    if "$" not in text:
        expanded = text
    else:
        expanded = _REFERENCE.sub(replace, text)
        text = _REFERENCE.sub(lambda m: "" if m.group(0) != "$${" else "${", text)  # the literal part alone
    if PLACEHOLDER in text:
        placeholders.insert(0, "the config file")
    if placeholders:
        problems.append(
            f"{where}: {PLACEHOLDER_PROBLEM} {' and in '.join(placeholders)}: replace it with the real value"
        )
    return expanded


def _read_secret(file: str, where: str, problems: list[str], files: MutableMapping[str, str | None]) -> str | None:
    """A file's text without its one trailing newline (as `echo` and editors leave it), or None
    with the problem recorded. Relative paths are refused: a process's working directory is no
    place to look for a secret, and would differ between a shell, a unit and a container."""
    if not file.startswith("/"):
        problems.append(f"{where}: ${{file:{file}}} must name an absolute path")
        return None
    try:
        data = read_file(file, MAX_SECRET_BYTES)
    except UnreadableFile as exc:
        files[file] = None
        problems.append(f"{where}: cannot read {file}: {exc.reason}")
        return None
    files[file] = digest(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        problems.append(f"{where}: {file} is not UTF-8 text")
        return None
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    if not text:
        # Whatever the value: a file is empty for a moment when it is rewritten in place (`echo new >
        # file` truncates first), and a reload then must keep the running value, not take "" for it
        # (an empty channel credential would be sent as none). A value meant to be empty is written
        # in the config itself.
        problems.append(f"{where}: {file} is empty")
        return None
    return text


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
