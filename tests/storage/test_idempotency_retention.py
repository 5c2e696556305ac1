"""Idempotency-Keys are remembered at least 7 days, then forgotten (the store, real engine,
an injected clock)."""

from __future__ import annotations

from pathlib import Path

from instantml.storage import UsagePolicy
from instantml.storage.base import CreateRun, Envelope, Idempotency, WriteScalars
from instantml.storage.duckdb_store import DuckDBStore

DAY = 86400.0


def test_keys_kept_seven_days_then_pruned(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    store = DuckDBStore(str(tmp_path / "s.duckdb"), UsagePolicy(clock=lambda: now[0]))
    org = store.ensure_org("o")
    store.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])

    def write(key: int, step: int) -> tuple[int, bool]:
        outcome = store.apply(
            [Envelope(WriteScalars(org, "r", step, {"a": 1.0}, 0.0), Idempotency(key, key, 1))]
        )[0]
        return outcome.status, outcome.replayed

    assert write(1, 0) == (200, False)
    now[0] += 7 * DAY
    assert write(1, 0) == (200, True)  # a week later: still a replay
    now[0] += 2 * DAY
    assert write(2, 1) == (200, False)  # any write may prune, at most hourly
    assert write(1, 0) == (200, False)  # nine days on: forgotten, applied afresh
    assert write(1, 0) == (200, True)  # and remembered again
    store.close()
