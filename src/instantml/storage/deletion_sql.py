"""Deleting runs, in SQL once for DuckDB and PostgreSQL: a run's metadata leaves in one
unit, and the series it had are queued (``purges``) for the point store to remove their
rows in bounded units afterwards (``PointStore.purge``), resumed after a restart. Also the
projects' retention: how many days a run may go without a write before it is deleted.

A deleted run's id is free at once: its series ids are never handed out again (they come
from a sequence), so rows still waiting in the point store belong to no run. The month's
usage is not touched: what was charged stays charged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .runs_sql import SqlRuns
from .sql import SqlEngine

DAY_SECONDS = 86_400.0


@dataclass
class _Staged:
    deleted: list[tuple[int, str, int, list[int]]] = field(default_factory=list)


class SqlDeletions:
    def __init__(self, engine: SqlEngine, runs: SqlRuns) -> None:
        self._engine = engine
        self._runs = runs
        engine.join(self)

    def delete_run(self, org_id: int, run_id: str) -> list[int] | None:
        """*In a unit*: the run, its series, attributes, ranks' activity, alerts and their
        deliveries gone; its series ids (returned) queued for purging. None: no such run."""
        if not self._engine.storable(run_id):
            return None
        execute = self._engine.execute
        rows = execute(
            "DELETE FROM runs WHERE org_id = %s AND run_id = %s RETURNING run_seq", [org_id, run_id]
        )
        if not rows:
            return None
        seq = int(rows[0][0])
        sids = [
            int(s)
            for (s,) in execute("DELETE FROM series WHERE run_seq = %s RETURNING series_id", [seq])
        ]
        execute("DELETE FROM attributes WHERE run_seq = %s", [seq])
        execute("DELETE FROM run_ranks WHERE run_seq = %s", [seq])
        execute(
            "DELETE FROM deliveries WHERE alert_id IN"
            " (SELECT alert_id FROM alerts WHERE org_id = %s AND run_id = %s)",
            [org_id, run_id],
        )
        execute("DELETE FROM alerts WHERE org_id = %s AND run_id = %s", [org_id, run_id])
        if sids:
            execute(
                "INSERT INTO purges (series_id, queued_at) SELECT unnest(%s::BIGINT[]), %s"
                " ON CONFLICT (series_id) DO NOTHING",
                [sids, time.time()],
            )
        staged: _Staged = self._engine.staged(self)
        staged.deleted.append((org_id, run_id, seq, sids))
        return sids

    def purges(self, limit: int) -> list[int]:
        """Series whose points are still to be removed, oldest deletion first."""
        rows = self._engine.read(
            "SELECT series_id FROM purges ORDER BY queued_at, series_id LIMIT %s", [limit]
        )
        return [int(sid) for (sid,) in rows]

    def purged(self, series_ids: Sequence[int]) -> None:
        """*In a unit*: these series' points are gone."""
        self._engine.execute(
            "DELETE FROM purges WHERE series_id = ANY(%s::BIGINT[])", [list(series_ids)]
        )

    # ---- retention ----

    def set_retention(self, org_id: int, project: str, days: int | None) -> None:
        """*In a unit*: a project's runs are deleted ``days`` after their last write (None:
        kept for ever, whatever the server's default)."""
        self._engine.execute(
            "INSERT INTO retention (org_id, project, days) VALUES (%s, %s, %s)"
            " ON CONFLICT (org_id, project) DO UPDATE SET days = excluded.days",
            [org_id, project, days],
        )

    def retention(self, org_id: int, project: str) -> tuple[bool, int | None]:
        """(whether the project has its own setting, its days)."""
        rows = self._engine.read(
            "SELECT days FROM retention WHERE org_id = %s AND project = %s", [org_id, project]
        )
        return (True, rows[0][0]) if rows else (False, None)

    def expired(self, now: float, default_days: float | None, limit: int) -> list[tuple[int, str]]:
        """Runs past their project's retention (``default_days`` where a project has no
        setting of its own; None: kept for ever), least recently written first."""
        rows = self._engine.read(
            f"SELECT r.org_id, r.run_id FROM {self._runs.read_from} r LEFT JOIN retention p"
            " ON p.org_id = r.org_id AND p.project = r.project"
            " WHERE CASE WHEN p.project IS NULL THEN CAST(%s AS DOUBLE PRECISION)"
            " ELSE p.days END IS NOT NULL"
            " AND r.updated_at < %s - %s * CASE WHEN p.project IS NULL"
            " THEN CAST(%s AS DOUBLE PRECISION) ELSE p.days END"
            " ORDER BY r.updated_at LIMIT %s",
            [default_days, now, DAY_SECONDS, default_days, limit],
        )
        return [(int(org), run_id) for org, run_id in rows]

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        pass

    def committed(self, staged: _Staged) -> Any:
        for org_id, run_id, seq, sids in staged.deleted:
            self._runs.forget(org_id, run_id, seq, sids)
