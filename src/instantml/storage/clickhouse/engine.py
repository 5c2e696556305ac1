"""A ClickHouse database for the point store: the client, the tables, units of work.

``clickhouse://[user:pass@]host:port/db`` talks to a ClickHouse server over its HTTP
interface; ``chdb://DIR`` runs the same engine in this process (one process only: tests,
development). Both through clickhouse-connect's client API.

Every table is insert-only (no mutation on the write path): a rewrite or a replay is a
newer version of a row (``ReplacingMergeTree(version)``), read with ``FINAL``. With a
cluster name (``INSTANTML_CLICKHOUSE_CLUSTER``) the tables are Replicated on each shard and
reached through a Distributed table, created ``ON CLUSTER``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
from clickhouse_connect.driver.exceptions import DatabaseError

from ...rankmath import step_blocks
from .. import safe_url
from ..records import StorageError
from ..unit import Participant, Units

# name -> (columns, ORDER BY)
TABLES: dict[str, tuple[str, str]] = {
    "rank_points": (
        "series_id UInt64, step Int64, rank Int16, world_size Int16, local_rank Int16,"
        " value Float64, weight Float64, ts Float64, version UInt64",
        "series_id, step, rank",
    ),
    "scores": (
        "series_id UInt64, step Int64, rank Int16, delta Float64, z Float64,"
        " robust_z Float64, version UInt64",
        "series_id, step, rank",
    ),
    # A scalar step is any finite number >= 0 (validation.scalar_step). (The table of
    # earlier versions, scalar_points, had Int64 steps: copied once, see ChPoints.)
    "scalars": (
        "series_id UInt64, step Float64, value Float64, ts Float64, preview UInt8, version UInt64",
        "series_id, step",
    ),
    "step_stats": (
        "series_id UInt64, step Int64, n UInt32, expected UInt32, mean Float64,"
        " weighted_mean Float64, min Float64, max Float64, std Float64, p05 Float64,"
        " p50 Float64, p95 Float64, mad Float64, mean_ad Float64, nonfinite UInt32,"
        " version UInt64",
        "series_id, step",
    ),
    # Per-rank sums by block of steps (rankmath/covers.py), for summaries flat in points.
    "rank_blocks": (
        "series_id UInt64, level UInt8, start Int64, rank Int16, n UInt32, marks UInt32,"
        " total Float64, last_step Int64, sum_delta Float64, sum_abs_z Float64,"
        " outliers UInt32, lr_step Int64, local_rank Int16, version UInt64",
        "series_id, level, start, rank",
    ),
    # A step series' sums by block of steps (rankmath/step_blocks.py): the band chart's
    # buckets without its step rows.
    "step_blocks": (
        "series_id UInt64, level UInt8, start Int64, "
        + ", ".join(
            f"{name} {'Int64' if name in step_blocks.INTS else 'Float64'}"
            for name in step_blocks.FIELDS
        )
        + ", version UInt64",
        "series_id, level, start",
    ),
    # The points that were outliers at the default thresholds when their step was last
    # refreshed: a row is current while the point's scores carry the same version.
    "outlier_rows": (
        "series_id UInt64, step Int64, rank Int16, local_rank Int16, value Float64,"
        " delta Float64, z Float64, robust_z Float64, version UInt64",
        "series_id, step, rank",
    ),
    # A step's aggregates are behind its points while its newest mark says stale = 1.
    "stale_steps": ("series_id UInt64, step Int64, stale UInt8, version UInt64", "series_id, step"),
}


CLOCK_SECONDS = 30.0  # how often the offset to the ClickHouse server's clock is measured


def ddl(database: str, cluster: str | None = None) -> list[str]:
    """The statements that create the point store's tables (idempotent)."""
    if cluster is None:
        return [f"CREATE DATABASE IF NOT EXISTS {database}"] + [
            f"CREATE TABLE IF NOT EXISTS {database}.{name} ({columns})"
            f" ENGINE = ReplacingMergeTree(version) ORDER BY ({order})"
            for name, (columns, order) in TABLES.items()
        ]
    on = f" ON CLUSTER {cluster}"
    statements = [f"CREATE DATABASE IF NOT EXISTS {database}{on}"]
    for name, (columns, order) in TABLES.items():
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {database}.{name}_local{on} ({columns})"
            " ENGINE = ReplicatedReplacingMergeTree("
            f"'/clickhouse/tables/{{shard}}/{database}/{name}', '{{replica}}', version)"
            f" ORDER BY ({order})"
        )
        # Sharded by series: a series' rows (and its FINAL merges) stay on one shard.
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {database}.{name}{on} AS {database}.{name}_local"
            f" ENGINE = Distributed({cluster}, {database}, {name}_local, series_id)"
        )
    return statements


class ChEngine:
    def __init__(self, url: str) -> None:
        import clickhouse_connect

        parts = urlsplit(url)
        self.url = url
        self._lock: threading.Lock | None = None
        self.cluster = os.environ.get("INSTANTML_CLICKHOUSE_CLUSTER")
        driver_log = logging.getLogger("clickhouse_connect")
        level = driver_log.level
        driver_log.setLevel(logging.CRITICAL)  # at start, our one-line error says it all
        try:
            if parts.scheme == "chdb":
                path = url.split("://", 1)[1]
                self.database = "instantml"
                self.client: Any = clickhouse_connect.get_client(interface="chdb", path=path)
                self._lock = threading.Lock()  # one embedded engine: one query at a time
            else:
                self.database = parts.path.strip("/") or "instantml"
                self.client = clickhouse_connect.get_client(
                    host=parts.hostname or "127.0.0.1",
                    port=parts.port or 8123,
                    username=unquote(parts.username or "default"),
                    password=unquote(parts.password or ""),
                    connect_timeout=10,
                    send_receive_timeout=300,
                    # No session: queries of several threads run at once on one client.
                    autogenerate_session_id=False,
                )
            for statement in ddl(self.database, self.cluster):
                self.client.command(statement)
        except Exception as exc:
            reason = " ".join(str(exc).split())  # one line
            raise StorageError(f"cannot use ClickHouse at {safe_url(url)}: {reason}") from None
        finally:
            driver_log.setLevel(level)
        self._units = Units(nullcontext)
        self._last_version = 0
        self._version_lock = threading.Lock()
        # Versions follow one clock for every server process: the ClickHouse server's
        # (this host's clock plus its measured offset), not each host's own.
        self._offset_ns = 0
        self._offset_at = float("-inf")
        self._shared_clock = parts.scheme != "chdb"

    def table(self, name: str) -> str:
        return f"{self.database}.{name}"

    def local(self, name: str) -> str:
        """The table that holds the rows (a statement a Distributed table cannot take,
        such as a delete, goes to every shard's own table)."""
        if self.cluster is None:
            return self.table(name)
        return f"{self.database}.{name}_local ON CLUSTER {self.cluster}"

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> None:
        with self.guarded() as client:
            client.command(sql, parameters=parameters or {})

    def version(self) -> int:
        """A version for rows written now: the clock in ns, strictly increasing here. On a
        ClickHouse server, that server's clock (re-measured every ``CLOCK_SECONDS``), so
        that processes on several hosts order their rows by one clock."""
        if self._shared_clock and time.monotonic() - self._offset_at > CLOCK_SECONDS:
            self._measure_offset()
        with self._version_lock:
            self._last_version = max(self._last_version + 1, time.time_ns() + self._offset_ns)
            return self._last_version

    def _measure_offset(self) -> None:
        try:
            before = time.time_ns()
            server = int(self.client.command("SELECT toUnixTimestamp64Nano(now64(9))"))
            after = time.time_ns()
        except Exception:  # keep the last offset; the write itself will say what is wrong
            return
        self._offset_ns = server - (before + after) // 2
        self._offset_at = time.monotonic()

    @contextmanager
    def guarded(self) -> Iterator[Any]:
        """The client, for one query (alone, on chdb). A server that cannot be reached, or
        that answers with an error of its own, is a StorageError: 503, retryable."""
        try:
            if self._lock is None:
                yield self.client
            else:
                with self._lock:
                    yield self.client
        except DatabaseError as exc:
            raise StorageError(f"ClickHouse: {' '.join(str(exc).split())}") from exc

    def query_np(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        with self.guarded() as client:
            return client.query_np(sql, parameters=parameters or {})

    def rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self.guarded() as client:
            return list(client.query(sql, parameters=parameters or {}).result_rows)

    def insert(self, table: str, columns: dict[str, Any]) -> None:
        with self.guarded() as client:
            client.insert(
                self.table(table), list(columns.values()), column_names=list(columns),
                column_oriented=True,
            )  # fmt: skip

    def insert_series(self, table: str, parts: list[dict[str, Any]], version: int) -> None:
        """One insert of several series' rows: each part a ``series_id`` number and columns
        of one length; every row stamped with ``version``. Nothing when every part is
        empty."""
        sized = [
            (part, len(next(v for k, v in part.items() if k != "series_id"))) for part in parts
        ]
        sized = [(part, n) for part, n in sized if n]
        if not sized:
            return
        columns: dict[str, Any] = {
            "series_id": np.concatenate(
                [np.full(n, part["series_id"], dtype=np.uint64) for part, n in sized]
            )
        }
        for name in sized[0][0]:
            if name != "series_id":
                columns[name] = np.concatenate([np.asarray(part[name]) for part, _ in sized])
        columns["version"] = np.full(len(columns["series_id"]), version, dtype=np.uint64)
        self.insert(table, columns)

    def join(self, participant: Participant) -> None:
        self._units.join(participant)

    def unit(self) -> AbstractContextManager[None]:
        """Stage this thread's writes; insert them when the block ends without error.
        (ClickHouse has no transaction over them: every write is idempotent by data, a
        newer version of the same rows, so a unit cut short is completed by its retry.)"""
        return self._units.unit()

    def staged(self, participant: Participant) -> Any:
        return self._units.staged(participant)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # closing is best effort
            pass
