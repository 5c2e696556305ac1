"""The local credentials file (``~/.instantml/credentials``, the public SDK's format:
``key = "value"`` lines): the SDK reads its key and server from it, and a server started on
loopback for the first time writes its admin key there."""

from __future__ import annotations

import os
import re
from pathlib import Path

_LINE = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"\s*$')


def credentials_file() -> Path:
    return Path.home() / ".instantml" / "credentials"


def read_credentials(path: Path | None = None) -> dict[str, str]:
    """The file's ``key = "value"`` lines; {} when it is absent or unreadable."""
    path = path or credentials_file()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def write_private(path: Path, text: str) -> None:
    """``text`` to ``path``, readable by its owner only (it holds a key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    path.chmod(0o600)


def write_credentials(path: Path, api_key: str, api_host: str) -> None:
    write_private(path, f'api_key = "{api_key}"\napi_host = "{api_host}"\n')
