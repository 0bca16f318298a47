"""Loading a config file: YAML, then `${VAR}` expansion, then the schema, then plugin names.

Every problem is reported at once, each with the key path and why, so one run of
`modelgate check-config` shows everything to fix.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from proxy.config.env import expand
from proxy.config.model import (
    ChannelConfig,
    GatewayConfig,
    RouteConfig,
    ServerConfig,
    SimulatorSettings,
    StateConfig,
    Timeouts,
    worker_count,
)
from proxy.config.problems import all_field_names, cross_section_problems

__all__ = [
    "ChannelConfig", "ConfigError", "GatewayConfig", "LoadedConfig", "RouteConfig", "ServerConfig",
    "SimulatorSettings", "StateConfig", "Timeouts", "load_config", "parse_config",
]


class ConfigError(Exception):
    """A config that must not be used; `problems` holds one `path: why` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class LoadedConfig:
    """A validated config and where it came from."""

    __slots__ = ("config", "source", "digest")

    def __init__(self, config: GatewayConfig, source: str, digest: str) -> None:
        self.config = config
        self.source = source
        self.digest = digest


# `modelgate serve --listen` sets it: the address wins over the file's, in workers and reloads too.
LISTEN_ENV = "MODELGATE_LISTEN"
# `modelgate serve --admin-listen` sets it, the same way; empty turns the admin listener off.
ADMIN_LISTEN_ENV = "MODELGATE_ADMIN_LISTEN"


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read and validate `path`; None gives the embedded defaults."""
    if path is None:
        config = parse_config("", os.environ if environ is None else environ)
        return LoadedConfig(config, "<embedded defaults>", hashlib.sha256(b"").hexdigest()[:16])
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"<file>: cannot read {path}: {exc.strerror or exc}"]) from None
    config = parse_config(text, os.environ if environ is None else environ)
    return LoadedConfig(config, str(path), text_digest(text))


def text_digest(text: str) -> str:
    """What names a config: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_config(text: str, environ: Mapping[str, str]) -> GatewayConfig:
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
    tree, problems = expand(tree, environ)
    server = tree.get("server", {})
    if environ.get(LISTEN_ENV) and isinstance(server, dict):  # a broken section is reported as it is
        tree["server"] = server = {**server, "listen": environ[LISTEN_ENV]}
    if ADMIN_LISTEN_ENV in environ and isinstance(server, dict):
        tree["server"] = {**server, "admin_listen": environ[ADMIN_LISTEN_ENV] or None}
    config: GatewayConfig | None = None
    try:
        config = GatewayConfig.model_validate(tree)
    except ValidationError as exc:
        problems.extend(_describe(error) for error in exc.errors())
    from proxy.registry import check_plugins, key_settings, plugin_config_problems  # plugins import config types

    problems.extend(check_plugins(tree))
    if config is not None:
        problems.extend(cross_section_problems(config))
        problems.extend(plugin_config_problems(config, worker_count(config)))
    if config is not None and not problems:
        for key in config.keys:  # the plugins' own fields on each key, as their models read them
            if key.model_extra:
                key.model_extra.update(key_settings(key.model_extra))
    if problems:
        raise ConfigError(problems)
    assert config is not None
    return config


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
