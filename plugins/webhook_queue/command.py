"""`modelgate webhooks`: what the durable queue holds, and putting entries through it again."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys

from plugins.webhook_queue.queue import QueuedWebhook, QueueFull, RedisError, Shelf
from proxy.config import GatewayConfig

_CONFIG_HELP = "config file (default: $MODELGATE_CONFIG, else the embedded defaults)"


def arguments(webhooks: argparse.ArgumentParser) -> None:
    webhooks.add_argument("-c", "--config", help=_CONFIG_HELP)
    actions = webhooks.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="print the oldest entries of a shelf, one JSON object a line")
    listing.add_argument("--shelf", choices=("pending", "delivered", "dead"), default="pending")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--bodies", action="store_true", help="include each body (else its size and SHA-256)")
    replay = actions.add_parser("replay", help="queue delivered or dead entries again, at the end, in order")
    replay.add_argument("--shelf", choices=("delivered", "dead"), default="dead")
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every entry of the shelf")
    which.add_argument("ids", nargs="*", default=[], help="entry ids, as `list` prints them")
    for action in (listing, replay):  # after the action too, where one would type it last
        action.add_argument("-c", "--config", help=_CONFIG_HELP, default=argparse.SUPPRESS)


def run_command(config: GatewayConfig, args: argparse.Namespace) -> int:
    return asyncio.run(_run(config, args))


async def _run(config: GatewayConfig, args: argparse.Namespace) -> int:
    from plugins.webhook_queue.settings import QueueSettings, queue_for

    settings = QueueSettings.model_validate(config.plugins.get("webhook_queue", {}))
    if not settings.enabled:
        print("the webhook queue is not enabled in this config (plugins.webhook_queue.enabled)", file=sys.stderr)
        return 1
    queue = queue_for(config, settings)
    try:
        shelf = Shelf(args.shelf)
        if args.action == "list":
            for webhook in await queue.entries(shelf, args.limit):
                print(json.dumps(describe(webhook, args.bodies)))
            backlog = await queue.backlog(shelf)
            print(f"{shelf.value}: {backlog.entries} entries, {backlog.bytes} bytes", file=sys.stderr)
        else:
            try:
                queued = await queue.replay(shelf, None if args.all else list(args.ids))
            except QueueFull as exc:  # within the pending shelf's bounds, as a callback from outside would be
                print(f"the pending shelf is full: {exc}", file=sys.stderr)
                return 1
            for entry_id in queued:
                print(entry_id)
            print(f"queued {len(queued)} webhook(s) again from {shelf.value}", file=sys.stderr)
            if not args.all and len(queued) < len(set(args.ids)):
                print(
                    f"{len(set(args.ids)) - len(queued)} of the ids named are not on {shelf.value} "
                    "(ids change as entries move between shelves: take them from `list`)",
                    file=sys.stderr,
                )
                return 1
        return 0
    except (RedisError, OSError) as exc:
        print(f"the webhook queue is unreachable: {exc}", file=sys.stderr)
        return 1
    finally:
        await queue.close()


def describe(webhook: QueuedWebhook, with_body: bool) -> dict[str, object]:
    shown: dict[str, object] = {
        "id": webhook.id,
        "received_at": webhook.received_at,
        "method": webhook.method,
        "target": webhook.target,
        "request_id": webhook.request_id,
        "bytes": len(webhook.body),
        "sha256": hashlib.sha256(webhook.body).hexdigest(),
        "headers": webhook.headers,
    }
    if webhook.outcome:
        shown.update(outcome=webhook.outcome, settled_at=webhook.settled_at)
    if with_body:
        try:
            shown["body"] = webhook.body.decode()
        except UnicodeDecodeError:
            shown["body_base64"] = base64.b64encode(webhook.body).decode()
    return shown
