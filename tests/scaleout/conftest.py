"""Several ``instantml server`` processes on one PostgreSQL database and one ClickHouse
database (reached over ClickHouse's HTTP interface: tests/clickhouse_http.py), each with
a data dir of its own, as on several hosts. Skipped where PostgreSQL is not installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from instantml.server.process import ServerProcess
from tests.engines import Engines


@dataclass
class Fleet:
    processes: list[ServerProcess]
    env: dict[str, str]  # the stores' settings every process runs with

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.processes]

    @property
    def admin_key(self) -> str:
        """The admin key: in the data dir of whichever process created it."""
        (key,) = [
            (p.data_dir / "admin-key").read_text().strip()
            for p in self.processes
            if (p.data_dir / "admin-key").exists()
        ]
        return key


@pytest.fixture
def shared_stores(engines: Engines) -> dict[str, str]:
    """A fresh PostgreSQL database and ClickHouse database, as server settings."""
    return {
        "INSTANTML_METADATA_URL": engines.postgres().new_database(),
        "INSTANTML_POINTS_URL": engines.clickhouse().url(),
    }


@pytest.fixture
def start_fleet(tmp_path: Path, shared_stores: dict[str, str]) -> Iterator[Callable[..., Fleet]]:
    """``start_fleet(n, env)``: n server processes started at once on the shared stores."""
    started: list[ServerProcess] = []

    def start(n: int = 3, env: dict[str, str] | None = None) -> Fleet:
        settings = {**shared_stores, **(env or {})}
        processes = [
            ServerProcess(
                tmp_path / f"host{len(started) + i}" / "data",
                env={"HOME": str(tmp_path / f"home{len(started) + i}"), **settings},
            )
            for i in range(n)
        ]
        started.extend(processes)
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda p: p.start(60), processes))
        return Fleet(processes, settings)

    yield start
    for proc in started:
        proc.stop()
