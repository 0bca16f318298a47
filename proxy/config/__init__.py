"""Loading a config file: YAML, then `${VAR}` and `${file:}` expansion, then the schema, then plugin names.

Every problem is reported at once, each with the key path and why, so one run of
`modelgate check-config` shows everything to fix.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import ValidationError

from proxy.config.env import PLACEHOLDER_PROBLEM, expand
from proxy.config.files import UnreadableFile, digest, read_file
from proxy.config.model import (
    ChannelConfig,
    GatewayConfig,
    RouteConfig,
    ServerConfig,
    SimulatorSettings,
    StateConfig,
    Timeouts,
)
from proxy.config.problems import all_field_names, cross_section_problems

__all__ = [
    "ChannelConfig",
    "ConfigError",
    "GatewayConfig",
    "LoadedConfig",
    "RouteConfig",
    "ServerConfig",
    "SimulatorSettings",
    "StateConfig",
    "Timeouts",
    "config_from_text",
    "load_config",
    "parse_config",
    "refuse_empty_reload",
]


class ConfigError(Exception):
    """A config that must not be used; `problems` holds one `path: why` line each, and `files`
    the files the attempt read (as `LoadedConfig.files`), so a watcher knows what to watch for a
    fix: a secret file that is missing now may be mounted in a moment."""

    def __init__(self, problems: list[str], files: Mapping[str, str | None] | None = None) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.files: dict[str, str | None] = dict(files or {})


class LoadedConfig:
    """A validated config, where it came from, and every file it was read from: the config file
    and each `${file:}`, with the digest of what each held then (None: it could not be read)."""

    __slots__ = ("config", "source", "digest", "files")

    def __init__(
        self, config: GatewayConfig, source: str, digest: str, files: Mapping[str, str | None] | None = None
    ) -> None:
        self.config = config
        self.source = source
        self.digest = digest
        self.files: dict[str, str | None] = dict(files or {})


# `modelgate serve --listen` sets it: the address wins over the file's, in workers and reloads too.
LISTEN_ENV = "MODELGATE_LISTEN"
# `modelgate serve --admin-listen` sets it, the same way; empty turns the admin listener off.
ADMIN_LISTEN_ENV = "MODELGATE_ADMIN_LISTEN"
# `modelgate serve --workers` sets it, the same way: the number of worker processes.
WORKERS_ENV = "MODELGATE_WORKERS"


class PluginRules(Protocol):
    """What the plugins hold a config to, asked by whoever parses one for use (proxy/registry.py
    has the registered plugins' rules): this package knows no plugin."""

    def problems(self, tree: dict[str, Any], config: GatewayConfig | None) -> list[str]:
        """What the plugins find wrong: in the raw `tree` (names, settings, pipelines) and, when
        its sections are valid, in the whole `config`."""
        ...

    def settle(self, config: GatewayConfig) -> None:
        """A valid config's plugin fields read as the plugins' models read them."""
        ...


def load_config(
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    *,
    rules: PluginRules,
    reloading: bool = False,
) -> LoadedConfig:
    """Read and validate `path`, its sections and, by `rules`, its plugins (no default: a config
    read for use is never left unchecked by forgetting them); None gives the embedded defaults.
    `reloading`: an empty file is refused (`refuse_empty_reload`)."""
    environ = os.environ if environ is None else environ
    if path is None:
        config = parse_config("", environ, rules)
        return LoadedConfig(config, "<embedded defaults>", hashlib.sha256(b"").hexdigest()[:16])
    try:
        data = read_file(str(path))
    except UnreadableFile as exc:
        raise ConfigError([f"<file>: cannot read {path}: {exc.reason}"], {str(path): None}) from None
    if reloading:
        refuse_empty_reload(str(path), data)
    try:  # as text files are read: universal newlines, so the digest is the one it always was
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        raise ConfigError([f"<file>: {path} is not UTF-8 text"], {str(path): digest(data)}) from None
    return config_from_text(text, str(path), environ, {str(path): digest(data)}, rules)


def refuse_empty_reload(path: str, data: bytes) -> None:
    """An empty config file is valid (the embedded defaults: the demo key, the simulator), and a
    file rewritten in place is empty between its truncation and its first write: a reload that
    read it then would serve the defaults. A reload refuses it; a start still takes it."""
    if not data.strip():
        raise ConfigError(
            [
                f"<file>: {path} is empty: a reload keeps the running config (only a start "
                "takes an empty file, as the embedded defaults)"
            ],
            {path: digest(data)},
        )


def config_from_text(
    text: str,
    source: str,
    environ: Mapping[str, str],
    files: Mapping[str, str | None] | None,
    rules: PluginRules,
) -> LoadedConfig:
    """Validate a config's text; `files` are those already read for it (the file it came from)."""
    read = dict(files or {})
    try:
        config = _parse(text, environ, read, rules)
    except ConfigError as exc:
        exc.files = read
        raise
    return LoadedConfig(config, source, text_digest(text), read)


def text_digest(text: str) -> str:
    """What names a config: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_config(text: str, environ: Mapping[str, str], rules: PluginRules) -> GatewayConfig:
    return _parse(text, environ, {}, rules)


def _parse(
    text: str, environ: Mapping[str, str], files: MutableMapping[str, str | None], rules: PluginRules
) -> GatewayConfig:
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise ConfigError([f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(["<root>: must be a mapping of sections (server, channels, ...)"])
    tree, problems = expand(tree, environ, files=files)
    server = tree.get("server", {})
    if environ.get(LISTEN_ENV) and isinstance(server, dict):  # a broken section is reported as it is
        tree["server"] = server = {**server, "listen": environ[LISTEN_ENV]}
    if ADMIN_LISTEN_ENV in environ and isinstance(server, dict):
        tree["server"] = server = {**server, "admin_listen": environ[ADMIN_LISTEN_ENV] or None}
    if environ.get(WORKERS_ENV) and isinstance(server, dict):
        tree["server"] = {**server, "workers": environ[WORKERS_ENV]}
    config: GatewayConfig | None = None
    try:
        config = GatewayConfig.model_validate(tree)
    except ValidationError as exc:
        problems.extend(_describe(error) for error in exc.errors())
    if config is not None:
        problems.extend(cross_section_problems(config))
    problems.extend(rules.problems(tree, config))
    if config is not None and not problems:
        rules.settle(config)
    if problems:
        raise ConfigError(_placeholders_first(problems))
    assert config is not None
    return config


def _placeholders_first(problems: list[str]) -> list[str]:
    """A value still holding a placeholder is said to once: what its key's own rules say of the
    placeholder (not a URL, too short) is no news, and would bury the line that says what to edit."""

    def key_of(problem: str) -> str:
        return re.sub(r"\[(\d+)\]", r".\1", problem.split(": ", 1)[0])  # plugins write list indices with dots

    held = {key_of(problem) for problem in problems if PLACEHOLDER_PROBLEM in problem}
    return [problem for problem in problems if PLACEHOLDER_PROBLEM in problem or key_of(problem) not in held]


def _describe(error: Any) -> str:
    path = _path(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(error["loc"][-1])
        hint = difflib.get_close_matches(key, sorted(all_field_names()), n=1)
        return f"{path}: unknown key" + (f" (did you mean '{hint[0]}'?)" if hint else "")
    if kind == "missing":
        return f"{path}: required"
    if kind == "value_error":
        return f"{path}: {error['ctx']['error']}"
    if kind == "literal_error":
        return f"{path}: {error['input']!r} is not one of {error['ctx']['expected']}"
    return f"{path}: {error['msg'][0].lower()}{error['msg'][1:]}"


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "literal[")):
            continue  # pydantic's internal validator names, not keys
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"
