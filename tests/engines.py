"""The scale-out engines of a test session, each started on first use and stopped at the
end: a throwaway PostgreSQL cluster (tests/postgres.py) and a ClickHouse HTTP endpoint over
chdb (tests/clickhouse_http.py). A test that needs PostgreSQL where it is not installed is
skipped, naming what to install."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.clickhouse_http import Endpoint
from tests.postgres import Cluster


class Engines:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._postgres: Cluster | None = None
        self._clickhouse: Endpoint | None = None

    def postgres(self) -> Cluster:
        if self._postgres is None:
            try:
                self._postgres = Cluster()
            except (FileNotFoundError, subprocess.CalledProcessError) as exc:
                pytest.skip(f"no PostgreSQL here ({exc}); scripts/test.sh installs it")
        return self._postgres

    def clickhouse(self) -> Endpoint:
        """One ClickHouse engine for the session (each test takes a fresh database)."""
        if self._clickhouse is None:
            self._clickhouse = Endpoint(self.root / "clickhouse" / "engine")
        return self._clickhouse

    def stop(self) -> None:
        if self._clickhouse is not None:
            self._clickhouse.stop()
        if self._postgres is not None:
            self._postgres.stop()
