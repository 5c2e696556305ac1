"""First start on an empty data dir: an org, an admin key, and local credentials."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from ..settings import ServerSettings
from ..storage.base import Store
from .auth import ALL_SCOPES, new_api_key

DEFAULT_ORG = "default"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    path.chmod(0o600)


def credentials_path() -> Path:
    return Path.home() / ".instantml" / "credentials"


def bootstrap(settings: ServerSettings, store: Store) -> str | None:
    """Create the admin key when the store has no key at all; return it (else None)."""
    if store.count_api_keys() > 0:
        return None
    org_id = store.ensure_org(DEFAULT_ORG)
    key, key_id, key_hash = new_api_key()
    store.add_api_key(org_id, key_id, key_hash, ALL_SCOPES)
    _write_private(settings.data_dir / "admin-key", key + "\n")
    credentials = credentials_path()
    if is_loopback(settings.host) and not credentials.exists():
        # Same format as the public SDK's credentials file, so either SDK finds the server.
        _write_private(
            credentials,
            f'api_key = "{key}"\napi_host = "{base_url(settings)}"\n',
        )
    return key


def base_url(settings: ServerSettings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}"
