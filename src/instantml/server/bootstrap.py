"""First start on an empty data dir: an org, an admin key, and local credentials."""

from __future__ import annotations

import ipaddress

from ..credentials import credentials_file, read_credentials, write_credentials, write_private
from ..settings import ServerSettings
from ..storage.protocols import Tenancy
from .auth import ALL_SCOPES, new_api_key

DEFAULT_ORG = "default"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bootstrap(settings: ServerSettings, tenancy: Tenancy) -> str | None:
    """Create the admin key when the store has no key at all; return it (else None)."""
    if tenancy.count_api_keys() > 0:
        return None
    org_id, _ = tenancy.ensure_org(DEFAULT_ORG)
    key, key_id, key_hash = new_api_key()
    if not tenancy.add_first_api_key(org_id, key_id, key_hash, ALL_SCOPES):
        return None  # another server process started on the same store first
    write_private(settings.data_dir / "admin-key", key + "\n")
    return key


def local_credentials(settings: ServerSettings, key: str | None, created: bool) -> list[str]:
    """Make the local SDK find this server with no setup, where that is ours to do (first
    start, loopback, no credentials file yet), and say exactly what was done: written, or
    an existing file kept (with what to use instead when it is for another key or address).
    The file has the public SDK's format, so either SDK finds the server."""
    path = credentials_file()
    url = base_url(settings)
    if key is None:
        return []
    exports = [
        f"  export INSTANTML_API_BASE_URL={url}",
        f"  export INSTANTML_API_KEY={key}",
    ]
    if path.exists():
        held = read_credentials(path)
        if held.get("api_key") == key and held.get("api_host", url).rstrip("/") == url:
            return [f"Local SDK credentials: {path} (this server and its admin key)"]
        other = held.get("api_host") or "no address"
        return [
            f"Kept {path}: it holds another key or address ({other}), so the SDK there will"
            " not reach this server. Use this server with:",
            *exports,
        ]
    if not created:
        why = "it is written on a data dir's first start only"
    elif not settings.write_credentials:
        why = "--no-credentials"
    elif not is_loopback(settings.host):
        why = "not bound to loopback"
    else:
        why = None
    if why is not None:
        return [f"No local SDK credentials file ({why}); use this server with:", *exports]
    write_credentials(path, key, url)
    return [f"Wrote the local SDK credentials (this server and its admin key) to {path}"]


def base_url(settings: ServerSettings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}"
