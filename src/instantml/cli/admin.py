"""``instantml keys`` and ``instantml usage``: the server's admin routes."""

from __future__ import annotations

import argparse
from typing import Any

from .http import ENV_HELP, CliError, call


def keys_create(args: argparse.Namespace) -> int:
    body = call("POST", "/api/keys", json={"org": args.org, "scopes": args.scopes})
    if body.get("org_created"):
        print(f"Created org {body['org']}.")
    print(
        f"Created key {body['key_id']} for org {body['org']} with scopes {','.join(body['scopes'])}."
    )
    print("It is shown once; store it now:")
    print(body["key"])  # alone on the last line, for scripts
    return 0


def keys_list(args: argparse.Namespace) -> int:
    body = call("GET", "/api/keys", params={"org": args.org} if args.org else None)
    print(f"{'key id':14} {'org':20} {'scopes':20} status")
    for k in body["keys"]:
        status = "revoked" if k["revoked_at"] else "active"
        print(f"{k['key_id']:14} {k['org'][:20]:20} {','.join(k['scopes']):20} {status}")
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    call("DELETE", f"/api/keys/{args.key_id}")
    print(f"Revoked key {args.key_id}.")
    return 0


def usage_show(args: argparse.Namespace) -> int:
    body = call("GET", "/api/usage", params={"org": args.org} if args.org else None)
    limit = "unlimited" if body["limit"] is None else f"{body['limit']:,}"
    print(
        f"org {body['org']}, {body['month']}: {body['used']:,} metric points used of {limit};"
        f" resets at {body['reset_at']}"
    )
    return 0


def usage_set_limit(args: argparse.Namespace) -> int:
    body = call("PUT", "/api/usage/limit", json={"org": args.org, "limit": args.limit})
    shown = "the server default" if body["limit"] is None else f"{body['limit']:,} points a month"
    print(f"org {body['org']}: monthly limit set to {shown}.")
    return 0


def monthly_limit(text: str) -> int | None:
    """A limit as typed: a whole number of points (``50000000``, ``50_000_000``), or
    ``none``/``unlimited`` for the server default."""
    if text.strip().lower() in ("none", "unlimited", "default"):
        return None
    try:
        value = int(text.replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of points; give a whole number, or 'none'"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give a number >= 0, or 'none'")
    return value


def add_commands(commands: Any) -> None:
    keys = commands.add_parser(
        "keys", help="create, list and revoke API keys", epilog=ENV_HELP
    ).add_subparsers(dest="keys_command", required=True, metavar="{create,list,revoke}")
    create = keys.add_parser(
        "create", help="mint a key for an org (the org is created if new)", epilog=ENV_HELP
    )
    create.add_argument("--org", default=None, help="org name (default: your key's org)")
    create.add_argument(
        "--scopes",
        nargs="+",
        default=["ingest", "read"],
        choices=["admin", "ingest", "read"],
        help="what the key may do (default: ingest read)",
    )
    create.set_defaults(func=keys_create)
    listing = keys.add_parser("list", help="list keys (never their secrets)", epilog=ENV_HELP)
    listing.add_argument("--org", default=None, help="org name, or * for every org (server admin)")
    listing.set_defaults(func=keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its id", epilog=ENV_HELP)
    revoke.add_argument("key_id", help="the key's id (`instantml keys list` shows them)")
    revoke.set_defaults(func=keys_revoke)

    usage = commands.add_parser(
        "usage", help="metric points used this month, and limits", epilog=ENV_HELP
    )
    usage.add_argument("--org", default=None, help="org name (default: your key's org)")
    usage.set_defaults(func=usage_show)
    usage_commands = usage.add_subparsers(dest="usage_command", metavar="{set-limit}")
    set_limit = usage_commands.add_parser(
        "set-limit", help="override an org's monthly limit (server admin)", epilog=ENV_HELP
    )
    set_limit.add_argument("--org", default=None, help="org name (default: your key's org)")
    set_limit.add_argument(
        "limit", type=monthly_limit, help="points a month, or 'none' for the server default"
    )
    set_limit.set_defaults(func=usage_set_limit)


__all__ = ["CliError", "add_commands"]
