"""``instantml keys`` and ``instantml usage``: talk to the server's admin routes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from .sdk import config


def _client() -> httpx.Client:
    key = config.resolve_api_key(None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=config.resolve_base_url(None), headers=headers, timeout=30)


def _call(method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
    try:
        with _client() as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the server: {exc}", file=sys.stderr)
        return None
    body = response.json()
    if response.status_code >= 300:
        print(f"error: {response.status_code}: {body.get('error')}", file=sys.stderr)
        return None
    return body


def keys_create(args: argparse.Namespace) -> int:
    body = _call("POST", "/api/keys", json={"org": args.org, "scopes": args.scopes})
    if body is None:
        return 1
    print(
        f"Created key {body['key_id']} for org {body['org']} with scopes {','.join(body['scopes'])}."
    )
    print("It is shown once; store it now:")
    print(body["key"])  # alone on the last line, for scripts
    return 0


def keys_list(args: argparse.Namespace) -> int:
    body = _call("GET", "/api/keys", params={"org": args.org} if args.org else None)
    if body is None:
        return 1
    print(f"{'key id':14} {'org':20} {'scopes':20} status")
    for k in body["keys"]:
        status = "revoked" if k["revoked_at"] else "active"
        print(f"{k['key_id']:14} {k['org'][:20]:20} {','.join(k['scopes']):20} {status}")
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    body = _call("DELETE", f"/api/keys/{args.key_id}")
    if body is None:
        return 1
    print(f"Revoked key {args.key_id}.")
    return 0


def usage_show(args: argparse.Namespace) -> int:
    body = _call("GET", "/api/usage", params={"org": args.org} if args.org else None)
    if body is None:
        return 1
    limit = "unlimited" if body["limit"] is None else f"{body['limit']:,}"
    print(
        f"org {body['org']}, {body['month']}: {body['used']:,} metric points used of {limit};"
        f" resets at {body['reset_at']}"
    )
    return 0


def usage_set_limit(args: argparse.Namespace) -> int:
    limit = None if args.limit.lower() in ("none", "unlimited") else int(args.limit)
    body = _call("PUT", "/api/usage/limit", json={"org": args.org, "limit": limit})
    if body is None:
        return 1
    shown = "the server default" if body["limit"] is None else f"{body['limit']:,} points a month"
    print(f"org {body['org']}: monthly limit set to {shown}.")
    return 0


def add_commands(commands: Any) -> None:
    keys = commands.add_parser("keys", help="create, list and revoke API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys.add_parser("create", help="mint a key for an org (created if new)")
    create.add_argument("--org", default=None, help="org name (default: your key's org)")
    create.add_argument(
        "--scopes", nargs="+", default=["ingest", "read"], choices=["admin", "ingest", "read"]
    )
    create.set_defaults(func=keys_create)
    listing = keys.add_parser("list", help="list keys (never their secrets)")
    listing.add_argument("--org", default=None, help="org name, or * for every org (server admin)")
    listing.set_defaults(func=keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=keys_revoke)

    usage = commands.add_parser("usage", help="metric points used this month, and limits")
    usage.add_argument("--org", default=None)
    usage.set_defaults(func=usage_show)
    usage_commands = usage.add_subparsers(dest="usage_command")
    set_limit = usage_commands.add_parser("set-limit", help="override an org's monthly limit")
    set_limit.add_argument("--org", default=None)
    set_limit.add_argument("limit", help="points a month, or 'none' for the server default")
    set_limit.set_defaults(func=usage_set_limit)
