"""The short form of the chaos campaign (``bench/chaos.py`` runs the long one): rank
processes logging while the server (and, in spool mode, the uploader) is SIGKILLed and
restarted every few seconds; nothing a call returned from is lost or doubled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import STORES
from tests.engines import Engines

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from chaos import chaos


@pytest.mark.parametrize(("mode", "seconds"), [("spool", 30.0), ("async", 20.0)])
def test_kills_lose_and_double_nothing(
    tmp_path: Path, mode: str, seconds: float, engines: Engines
) -> None:
    # The suite's second pass: PostgreSQL and a ClickHouse server, each a process of its
    # own that outlives the killed server (as deployed; chdb would die inside it).
    stores = {}
    if STORES != "duckdb":
        stores = {
            "INSTANTML_METADATA_URL": engines.postgres().new_database(),
            "INSTANTML_POINTS_URL": engines.clickhouse().url(),
        }
    report = chaos(tmp_path, seconds, mode, ranks=4, seed=7, kill_every=(2.0, 6.0), stores=stores)
    print("\n".join(report.lines()))
    assert report.server_kills >= 2
    assert report.returned > 1000
    assert report.ok, report.lines()
    assert report.stored == report.returned - report.dropped
