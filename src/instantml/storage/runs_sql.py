"""The reads of runs that are plain SQL, once for DuckDB and PostgreSQL: a run with the
config written after its creation, a project's runs, a run's attributes, its ranks'
activity. Each engine's runs store says how a statement runs; what it keeps in memory
(the embedded store's id maps, the shared one's caches) stays its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .records import RankActivity, RunRecord, run_record

RUN_COLUMNS = (
    "org_id, run_id, project, name, status, config, tags, metadata, created_at, updated_at,"
    " world_size, last_step"
)


class SqlRunReads:
    """Subclasses say how a statement runs (``read``: committed data), with ``%s``
    placeholders, and how a value is matched against a list parameter (``ANY_OF``)."""

    ANY_OF: str  # "{column} is one of the list %s", with {column} filled in

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def storable(self, *texts: str | None) -> bool:
        """Whether the engine can hold these texts at all (else no row has them)."""
        return True

    def get_run(self, org_id: int, run_id: str) -> RunRecord | None:
        if not self.storable(run_id):
            return None
        rows = self.read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE org_id = %s AND run_id = %s", [org_id, run_id]
        )
        if not rows:
            return None
        record = run_record(rows[0])
        # Config written after creation (the public SDK's log_config) as config attributes.
        for path, value in self.read(
            "SELECT a.path, a.value FROM attributes a JOIN runs r USING (run_seq)"
            " WHERE r.org_id = %s AND r.run_id = %s AND a.type = 'config'"
            " AND starts_with(a.path, 'config/') ORDER BY a.seq",
            [org_id, run_id],
        ):
            record.config[path.removeprefix("config/")] = orjson.loads(value)
        return record

    def list_runs(self, org_id: int, project: str | None, limit: int) -> list[RunRecord]:
        if not self.storable(project):
            return []
        rows = self.read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE org_id = %s"
            " AND (CAST(%s AS TEXT) IS NULL OR project = %s)"
            " ORDER BY created_at DESC, run_seq DESC LIMIT %s",
            [org_id, project, project, limit],
        )
        return [run_record(row) for row in rows]

    def attributes_of(
        self, org_id: int, run_id: str, kinds: Sequence[str], prefix: str
    ) -> list[tuple[str, str, int | None, Any]]:
        if not self.storable(run_id, prefix):
            return []
        rows = self.read(
            "SELECT a.type, a.path, a.step, a.value FROM attributes a JOIN runs r USING (run_seq)"
            f" WHERE r.org_id = %s AND r.run_id = %s AND {self.ANY_OF.format(column='a.type')}"
            " AND starts_with(a.path, %s) ORDER BY a.seq",
            [org_id, run_id, list(kinds), prefix],
        )
        return [(kind, path, step, orjson.loads(value)) for kind, path, step, value in rows]

    def rank_activity(self, org_id: int, run_id: str) -> dict[int, RankActivity]:
        if not self.storable(run_id):
            return {}
        rows = self.read(
            "SELECT k.rank, k.first_seen, k.last_seen, k.finished_at FROM run_ranks k"
            " JOIN runs r USING (run_seq) WHERE r.org_id = %s AND r.run_id = %s",
            [org_id, run_id],
        )
        return {int(r): RankActivity(float(a), float(b), c) for r, a, b, c in rows}
