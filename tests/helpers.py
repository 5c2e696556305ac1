"""Small helpers shared by tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx


def rank_body(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "metrics": {"train/loss": 0.5},
        "step": 1,
        "rank": 0,
        "world_size": 8,
        "local_rank": 0,
        "weight": 1.0,
    }
    body.update(overrides)
    return body


RANK_ROW = ("step", "rank", "value", "weight", "local_rank", "world_size")


def stored_rank_points(api: httpx.Client, run_id: str, key: str) -> list[list[object]]:
    """Every stored rank point of a key ([] when the key has none), as
    ``[step, rank, value, weight, local_rank, world_size]`` (a non-finite value as its
    mark), read from the JSON export's named columns."""
    response = api.get(f"/api/runs/{run_id}/rank-points", params={"metric": key})
    if response.status_code == 404:
        return []
    assert response.status_code == 200, response.text
    body = response.json()
    at = [body["columns"].index(name) for name in RANK_ROW]
    return [[row[i] for i in at] for row in body["points"]]


def stored_scalars(api: httpx.Client, run_id: str, key: str) -> dict[str, list[list[object]]]:
    """A scalar key's stored points: ``points`` (finite) as ``[step, value]`` and
    ``nonfinite`` as ``[step, mark]``, read from the JSON export."""
    response = api.get(f"/api/runs/{run_id}/metrics", params={"key": key})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["columns"] == ["step", "value", "timestamp"]
    rows = [[step, value] for step, value, _ in body["points"]]
    return {
        "points": [r for r in rows if not isinstance(r[1], str)],
        "nonfinite": [r for r in rows if isinstance(r[1], str)],
    }


def stored_keys(api: httpx.Client, run_id: str) -> list[dict[str, object]]:
    response = api.get(f"/api/runs/{run_id}/keys")
    assert response.status_code == 200, response.text
    return response.json()["keys"]  # type: ignore[no-any-return]


def admin_client(server: object) -> httpx.Client:
    """A client with the server's admin key; use it in a ``with`` block."""
    return httpx.Client(
        base_url=server.url,  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {server.admin_key}"},  # type: ignore[attr-defined]
        timeout=60,
    )


def instantml(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``instantml ARGS`` as a user runs it: a real process, ``env`` over this one's."""
    return subprocess.run(
        [sys.executable, "-m", "instantml", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def hung_peer() -> Iterator[str]:
    """The URL of a peer that accepts connections and never answers: a server stuck under
    load (for "down", use an address where nothing listens: ``free_port()``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def store_rank_rows(stores: Any, series_id: int) -> list[tuple[Any, ...]]:
    """A series' rank points as the store exports them, as ``(step, rank, value, weight,
    local_rank, world_size)`` tuples by step then rank."""
    from instantml.storage import export
    from instantml.storage.records import RANK

    rows: list[tuple[Any, ...]] = []
    for table in export.tables(stores.export, RANK, series_id, None, None):
        columns = [table.column(n).to_pylist() for n in ("step", "rank", "value", "weight")]
        columns += [table.column(n).to_pylist() for n in ("local_rank", "world_size")]
        rows.extend(zip(*columns))
    return rows


def store_scalar_rows(stores: Any, series_id: int) -> list[tuple[float, float]]:
    """A series' scalar points as the store exports them: ``(step, value)`` by step."""
    from instantml.storage import export
    from instantml.storage.records import SCALAR

    rows: list[tuple[float, float]] = []
    for table in export.tables(stores.export, SCALAR, series_id, None, None):
        rows.extend(zip(table.column("step").to_pylist(), table.column("value").to_pylist()))
    return rows
