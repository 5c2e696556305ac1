"""The short form of the soak (``bench/soak.py`` runs 30 minutes): steady batched ingest
with the summary polled every 5 s; every write and every summary answered."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from soak import line, soak


def test_a_short_soak_answers_everything(
    tmp_path: Path, stores_env: Callable[[Path], dict[str, str]]
) -> None:
    stores = stores_env(tmp_path / "data")
    # The run starts 200 steps long, written through the stores (``--preload``), and the
    # soak goes on from there, its events spread over two groups of three keys (``--keys``).
    intervals = soak(tmp_path, 30.0, 60_000.0, 10.0, log=False, stores=stores, preload=200, keys=6)
    for number, interval in enumerate(intervals, 1):
        print(line(interval, number, 10.0))
    assert sum(iv.failures for iv in intervals) == 0
    assert sum(iv.points for iv in intervals) >= 0.25 * 60_000 * 30  # it kept up, roughly
    assert all(iv.reads for iv in intervals[1:])  # the summary was polled throughout
    assert all(iv.rss > 0 for iv in intervals)
