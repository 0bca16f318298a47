"""What a config can get wrong beyond each key's own rules: problems only the whole shows, and
the names a misspelt key may have meant."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from proxy.config.model import GatewayConfig, same_address, worker_count
from proxy.config.prices import shadowed


def cross_section_problems(config: GatewayConfig) -> list[str]:
    """Problems no single section shows on its own."""
    problems = []
    workers = worker_count(config)
    if workers > 1 and config.state.backend == "memory":
        problems.append(
            f"server.workers: {workers} workers cannot share the memory state backend: each process "
            f"would keep its own rate limits and affinity pins, so limits would be {workers} times too "
            "loose and follow-up requests could lose their channel; use state.backend: redis, or workers: 1"
        )
    server = config.server
    if server.admin_listen and same_address(server.listen, server.admin_listen):
        problems.append(
            f"server.admin_listen: {server.admin_listen} is where server.listen ({server.listen}) serves "
            "clients; the admin listener needs an address of its own (another port, or null to turn "
            "it off, or modelgate serve --admin-listen HOST:PORT)"
        )
    if config.console.oidc is not None and config.key_store.database_url is None:
        problems.append(
            "console.oidc: the console is served only with a key store (key_store.database_url): it "
            "works through the admin API's operations and keeps its sessions' key there"
        )
    if config.console.oidc is not None and not server.admin_listen:
        problems.append("console.oidc: the console is on the admin listener, and server.admin_listen is off")
    problems.extend(shadowed(config.prices))
    return problems


def all_field_names() -> set[str]:
    """Every key the schema knows, for 'did you mean' hints."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    waiting: list[type[BaseModel]] = [GatewayConfig]
    while waiting:
        model = waiting.pop()
        if model in seen:
            continue
        seen.add(model)
        names.update(model.model_fields)
        waiting.extend(t for field in model.model_fields.values() for t in _model_types(field.annotation))
    return names


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds (`list[KeyConfig]`, `X | None` ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [t for arg in getattr(annotation, "__args__", ()) for t in _model_types(arg)]
