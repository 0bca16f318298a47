"""The `modelgate` command: serve, check-config, openapi, simulate, the key store's (keys,
tenants, admin-token, audit), and the commands plugins add.

A command loads what it uses and no more: the key store's commands talk to the admin API over
HTTP and start in a fraction of the time the gateway's imports take; the plugins (and their
commands) are loaded only for a command that is not one of the gateway's own, or for help."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from proxy.keystore.cli import COMMANDS as ADMIN_COMMANDS
from proxy.keystore.cli import add_commands as add_admin_commands
from proxy.keystore.cli import run as run_admin

if TYPE_CHECKING:
    from proxy.core.plugin import PluginCommand

BUILT_IN = ("serve", "check-config", "openapi", "simulate", *ADMIN_COMMANDS)


def plugin_commands() -> list[PluginCommand]:
    """The commands registered plugins add (importing every plugin)."""
    from proxy.registry import plugin_commands as registered

    return registered()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="modelgate", description="A pluggable reverse proxy for model APIs.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("-c", "--config", help="config file (default: $MODELGATE_CONFIG, else the embedded defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="the address to serve on, over the config's server.listen")
    serve.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="the admin listener's address (/metrics, /readyz in detail), over the config's "
        "server.admin_listen; '' turns it off",
    )
    serve.add_argument("--workers", metavar="N", help="worker processes, over the config's server.workers")

    check = commands.add_parser("check-config", help="validate a config file and list every problem")
    check.add_argument("file", nargs="?", help="the config file (or -c FILE, as serve takes it)")
    check.add_argument("-c", "--config", dest="config_file", help=argparse.SUPPRESS)

    openapi = commands.add_parser("openapi", help="print the gateway's interface as an OpenAPI 3.1 document")
    openapi.add_argument("-o", "--output", help="write to this file instead of standard output")
    openapi.add_argument(
        "--admin",
        action="store_true",
        help="the admin API's document (served on the admin listener) instead of the interface's",
    )

    simulate = commands.add_parser("simulate", help="run the upstream simulator on its own")
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--port", type=int, default=9000)
    simulate.add_argument("--name", default="simulator", help="reported in the x-sim-instance header")
    simulate.add_argument("--key", help="the upstream credential it requires (default: any)")
    simulate.add_argument("--latency-ms", type=float, default=0.0)
    simulate.add_argument("--chunk-delay-ms", type=float, default=5.0)
    simulate.add_argument("--output-tokens", type=int, default=24)
    simulate.add_argument("--video-queued-s", type=float, default=1.0)
    simulate.add_argument("--video-processing-s", type=float, default=2.0)

    add_admin_commands(commands)  # keys, tenants, admin-token, audit (proxy/keystore/cli.py)

    extra: dict[str, PluginCommand] = {}
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    for command in plugin_commands() if named not in BUILT_IN else ():
        if command.name in commands.choices:  # the gateway's own commands, or a plugin's that came first
            print(f"a plugin's command '{command.name}' is taken; it is left out", file=sys.stderr)
            continue
        extra[command.name] = command
        command.arguments(commands.add_parser(command.name, help=command.help))

    args = parser.parse_args(argv)
    if args.command == "check-config":
        if (args.file is None) == (args.config_file is None):
            check.error("name one config file: check-config FILE, or check-config -c FILE")
        return _check_config(args.file or args.config_file)
    if args.command == "openapi":
        return _openapi(args.output, args.admin)
    if args.command in ADMIN_COMMANDS:
        return _admin(args)
    if args.command == "simulate":
        from simulator.server import run_simulator

        run_simulator(args)
        return 0
    from proxy.config import ADMIN_LISTEN_ENV, LISTEN_ENV, WORKERS_ENV, ConfigError
    from proxy.registry import load_config

    path = getattr(args, "config", None) or os.environ.get("MODELGATE_CONFIG") or None
    if getattr(args, "workers", None):
        os.environ[WORKERS_ENV] = args.workers  # checked with the config: a problem at server.workers
    if getattr(args, "listen", None):
        problem = _listen_problem(args.listen)
        if problem:
            print(f"--listen: {problem}", file=sys.stderr)
            return 1
        os.environ[LISTEN_ENV] = args.listen  # worker processes and reloads read it too
    if getattr(args, "admin_listen", None) is not None:
        problem = _listen_problem(args.admin_listen) if args.admin_listen else None
        if problem:
            print(f"--admin-listen: {problem}", file=sys.stderr)
            return 1
        os.environ[ADMIN_LISTEN_ENV] = args.admin_listen
    try:
        loaded = load_config(path)
    except ConfigError as exc:
        _print_problems(path or "<embedded defaults>", exc.problems)
        return 1
    if args.command in extra:
        return extra[args.command].run(loaded.config, args)
    from proxy.process.server import serve as run

    return run(loaded, path)


def _admin(args: argparse.Namespace) -> int:
    config = None
    if args.config:
        from proxy.config import ConfigError
        from proxy.registry import load_config

        try:
            config = load_config(args.config).config
        except ConfigError as exc:
            _print_problems(args.config, exc.problems)
            return 1
    return run_admin(args, config)


def _openapi(output: str | None, admin: bool = False) -> int:
    import json

    if admin:
        from proxy.keystore.openapi import admin_openapi_document as document
    else:
        from proxy.schemas.openapi import openapi_document as document

    text = json.dumps(document(), indent=2, sort_keys=False) + "\n"
    if output:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _listen_problem(listen: str) -> str | None:
    from pydantic import ValidationError

    from proxy.config.model import ServerConfig

    try:
        ServerConfig(listen=listen)
    except ValidationError as exc:
        error = exc.errors()[0]
        return str(error.get("ctx", {}).get("error", error["msg"]))  # our own words, without pydantic's prefix
    return None


def _check_config(path: str) -> int:
    from proxy.config import ADMIN_LISTEN_ENV, LISTEN_ENV, WORKERS_ENV, ConfigError
    from proxy.registry import config_warnings, load_config

    overrides = (LISTEN_ENV, ADMIN_LISTEN_ENV, WORKERS_ENV)
    try:  # the file as written: a `serve --listen`, `--admin-listen` or `--workers` override is no part of it
        loaded = load_config(path, {name: value for name, value in os.environ.items() if name not in overrides})
    except ConfigError as exc:
        _print_problems(path, exc.problems)
        return 1
    config = loaded.config
    print(f"{path}: ok ({len(config.channels)} channel(s), digest {loaded.digest})")
    # Where the keys come from: this file's, and the key store's when there is one (listed by
    # `modelgate keys list`, each with its source).
    stored = config.key_store.database_url
    print(
        f"  keys: {len(config.keys)} from this file"
        + (f"; more managed at run time in the key store ({_where(stored)}: modelgate keys list)" if stored else "")
    )
    for warning in config_warnings(config):  # served as written, but its operator must know
        print(f"  warning: {warning}", file=sys.stderr)
    return 0


def _where(url: str) -> str:
    """A database URL without its credentials: host, port and database."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def _print_problems(path: str, problems: list[str]) -> None:
    print(f"{path}: {len(problems)} problem(s)", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
