"""The statements a unit of work runs on runs (``runs_sql.py``), for DuckDB and PostgreSQL."""

from __future__ import annotations

# One statement for both: a run given points without growing still gets its count. A plain
# WHERE for one run, which an embedded engine runs in about half the time of the join,
# counted rather than RETURNING its row (a third of the statement's time there).
_SIZE = (
    "world_size = CASE WHEN {size} > 0 THEN greatest(coalesce(world_size, 0), {size})"
    " ELSE world_size END, "
)
_GROWTH = (
    "last_step = CASE WHEN {last} >= 0"
    " THEN greatest(coalesce(last_step, -1), {last}) ELSE last_step END,"
    " points = coalesce(points, 0) + {n}, updated_at = %s"
)
_SETS = _SIZE + _GROWTH
_ONE = {"size": "%s::INTEGER", "last": "%s::BIGINT", "n": "%s::BIGINT"}
EXTEND_ONE = f"UPDATE runs SET {_SETS.format(**_ONE)} WHERE run_seq = %s"
# The same for a run whose world size is known not to grow (nearly every unit): DuckDB
# versions each column an UPDATE sets, and a column fewer is a good part of its cost.
EXTEND_ONE_SAME_SIZE = f"UPDATE runs SET {_GROWTH.format(**_ONE)} WHERE run_seq = %s"
EXTEND = (
    f"UPDATE runs SET {_SETS.format(size='e.size', last='e.last', n='e.n')}"
    " FROM (SELECT unnest(%s::BIGINT[]) AS seq, unnest(%s::INTEGER[]) AS size,"
    " unnest(%s::BIGINT[]) AS last, unnest(%s::BIGINT[]) AS n) AS e"
    " WHERE runs.run_seq = e.seq RETURNING runs.run_seq"
)

# A rank's activity, one row per (run, rank): its last sighting only moves forward.
SEE_RANKS = (
    "INSERT INTO run_ranks (run_seq, rank, first_seen, last_seen, finished_at, node)"
    " SELECT s, k, a, a, f, n FROM (SELECT unnest(%s::BIGINT[]) AS s,"
    " unnest(%s::INTEGER[]) AS k, unnest(%s::DOUBLE PRECISION[]) AS a,"
    " unnest(%s::DOUBLE PRECISION[]) AS f, unnest(%s::TEXT[]) AS n) AS e"
    " ON CONFLICT (run_seq, rank) DO UPDATE SET"
    " last_seen = greatest(run_ranks.last_seen, excluded.last_seen),"
    " finished_at = coalesce(excluded.finished_at, run_ranks.finished_at),"
    " node = coalesce(excluded.node, run_ranks.node)"
)
