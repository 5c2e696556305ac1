"""The embedded engine checkpoints when the writer is idle, not inside a write's COMMIT
(storage/duckdb/engine.py: the write that crossed DuckDB's threshold used to wait for the
whole checkpoint)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from instantml.server.write.committer import GroupCommitter
from instantml.server.write.service import WriteService
from instantml.storage import open_stores
from instantml.storage.duckdb.engine import IDLE_CHECKPOINT_BYTES
from tests.storage.test_points import Writer
from tests.summary.reference import Point


def wal_bytes(path: Path) -> int:
    wal = Path(f"{path}.wal")
    return wal.stat().st_size if wal.exists() else 0


def test_the_writer_checkpoints_when_idle_and_no_write_pays_for_it(tmp_path: Path) -> None:
    path = tmp_path / "stores.duckdb"
    stores = open_stores(f"duckdb://{path}")
    writer = Writer(stores)
    rng = np.random.default_rng(3)
    # Units of 20,000 points (under a row group, so they go through the log) until the
    # log is past the size at which DuckDB would have checkpointed inside a COMMIT.
    step = 0
    while wal_bytes(path) < IDLE_CHECKPOINT_BYTES and step < 20_000:
        values = rng.normal(size=20 * 1000)
        writer.write(
            [
                Point(step + i // 1000, i % 1000, float(v), 1.0, None, 1000)
                for i, v in enumerate(values)
            ]
        )
        step += 20
    assert wal_bytes(path) >= IDLE_CHECKPOINT_BYTES  # no COMMIT checkpointed at 16 MiB
    assert stores.checkpoint_due()
    service = WriteService(stores)
    assert service.backlog() >= 1  # so the writer wakes for it when idle
    committer = GroupCommitter(service)
    try:
        deadline = time.monotonic() + 30
        while stores.checkpoint_due() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stores.checkpoint_due()
        assert wal_bytes(path) < IDLE_CHECKPOINT_BYTES
    finally:
        committer.close()
    stores.close()
    again = open_stores(f"duckdb://{path}")
    assert again.points.counts([writer.sid]) == {writer.sid: (step * 1000, step - 1)}
    again.close()


def test_a_store_in_memory_never_checkpoints() -> None:
    stores = open_stores("duckdb://:memory:")
    Writer(stores).write([Point(0, 0, 1.0)])
    assert not stores.checkpoint_due()
    stores.checkpoint()  # nothing to do, and harmless
    stores.close()
