"""Block rows in DuckDB (what a block is: :mod:`instantml.rankmath.covers`), one row per
(series, start, rank) in a table per level (``rank_blocks_1`` .. ``rank_blocks_8``), built
and combined in SQL.

A table per level, because of how a summary reads them: a heatmap's cover takes a few
blocks of each level from every bucket, spread over the whole run, so no zone map skips
a row group of a table that holds every level. In a level's own table, rows sit in the
order they were built (by step), and the read of that level's starts (a semi-join on
them) skips most of the rest, so a long run's cover reads far less.

Blocks are derived data: a write marks the level-1 blocks of the steps it touched
(``stale_blocks``, in the same unit as the points; a block holding a step the write left
stale is stale by that step's row alone until the step is scored again: ``head.py``'s
``implied_blocks``), and ``recompute`` rebuilds those and
their ancestors from the points' current scores (after stale steps are recomputed), in
the background or before a read. Rewrites, late points and replays go the same way, so
every level stays exact. A block is built only once its series has a step past its end
(until then no cover uses it), and a summary reads the points of the level-1 blocks still
stale in its snapshot instead of their blocks, so it never waits on this work and never
reads a block behind its points.
"""

from __future__ import annotations

import numpy as np

from ...rankmath import covers, step_blocks
from ...rankmath.covers import BASE, DEFAULT_Z, LEVELS, RZ
from ..querier import STEP_COLUMNS
from .engine import Engine


def table(level: int) -> str:
    """The table of this level's block rows."""
    return f"rank_blocks_{level}"


_COLUMNS = """(
    series_id INTEGER NOT NULL, start BIGINT NOT NULL,
    rank SMALLINT NOT NULL, n INTEGER NOT NULL, marks INTEGER NOT NULL,
    total DOUBLE NOT NULL, last_step BIGINT NOT NULL, sum_delta DOUBLE NOT NULL,
    sum_abs_z DOUBLE NOT NULL, outliers INTEGER NOT NULL, lr_step BIGINT,
    local_rank SMALLINT);"""
STEP_BLOCK_COLUMNS = ", ".join(
    f"{name} {'BIGINT' if name in step_blocks.INTS else 'DOUBLE'} NOT NULL"
    for name in step_blocks.FIELDS
)
SCHEMA = (
    "".join(
        f"CREATE TABLE IF NOT EXISTS {table(level)} {_COLUMNS}\n" for level in range(1, LEVELS + 1)
    )
    + f"""
CREATE TABLE IF NOT EXISTS stale_blocks (series_id INTEGER NOT NULL, start BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS step_blocks (series_id INTEGER NOT NULL, level TINYINT NOT NULL,
    start BIGINT NOT NULL, {STEP_BLOCK_COLUMNS});
CREATE TABLE IF NOT EXISTS outlier_rows (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, rank SMALLINT NOT NULL,
    local_rank SMALLINT, value DOUBLE NOT NULL, delta DOUBLE, z DOUBLE, robust_z DOUBLE);
"""
)

# A point's contribution, and a group of contributions' sum: the columns of a block
# table after (series_id, start, rank), in order.
# (A score is NULL in rank_points and NaN in a staged frame where it has none; DuckDB
# orders NaN above every number, so a NaN must not pass the threshold.)
IS_OUTLIER = (
    f"((isfinite(z) AND abs(z) >= {DEFAULT_Z}) OR (isfinite(robust_z) AND abs(robust_z) >= {RZ}))"
)
POINT_SUMS = (
    "count(*) FILTER (WHERE isfinite(value)), count(*) FILTER (WHERE NOT isfinite(value)),"
    " coalesce(sum(value) FILTER (WHERE isfinite(value)), 0), max(step),"
    " coalesce(sum(delta), 0), coalesce(sum(abs(z)), 0),"
    f" count(*) FILTER (WHERE {IS_OUTLIER}),"
    " max(step) FILTER (WHERE local_rank IS NOT NULL),"
    " arg_max(local_rank, step) FILTER (WHERE local_rank IS NOT NULL)"
)
BLOCK_SUMS = (
    "sum(n)::INTEGER, sum(marks)::INTEGER, sum(total), max(last_step), sum(sum_delta),"
    " sum(sum_abs_z), sum(outliers)::INTEGER, max(lr_step),"
    " arg_max(local_rank, lr_step) FILTER (WHERE lr_step IS NOT NULL)"
)
# A point as a row of block columns (for summing points and blocks together; no NULLs).
POINT_AS_BLOCK = (
    "rank, CASE WHEN isfinite(value) THEN 1 ELSE 0 END AS n,"
    " CASE WHEN isfinite(value) THEN 0 ELSE 1 END AS marks,"
    " CASE WHEN isfinite(value) THEN value ELSE 0 END AS total, step AS last_step,"
    " coalesce(delta, 0) AS sum_delta, coalesce(abs(z), 0) AS sum_abs_z,"
    f" CASE WHEN {IS_OUTLIER} THEN 1 ELSE 0 END AS outliers,"
    " CASE WHEN local_rank IS NULL THEN -1 ELSE step END AS lr_step, local_rank"
)


def create(engine: Engine) -> None:
    """The tables. A store that kept every level in one table (``rank_blocks``) has its
    rows moved to the level tables, once; a store written before blocks (or before step
    blocks) existed gets every block marked stale, once, and its outlier rows found (those
    before blocks)."""
    con = engine.con

    def exists(name: str) -> bool:
        return bool(
            con.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
            ).fetchall()[0][0]
        )

    existed, one_table = exists(table(1)), exists("rank_blocks")
    stepped = exists("step_blocks")
    con.execute(SCHEMA)
    if one_table:  # in one transaction: a crash halfway leaves the one table as it was
        con.execute("BEGIN TRANSACTION")
        try:
            for level in range(1, LEVELS + 1):
                con.execute(
                    f"INSERT INTO {table(level)} SELECT * EXCLUDE (level) FROM rank_blocks"
                    " WHERE level = ? ORDER BY start, series_id, rank",
                    [level],
                )
            con.execute("DROP TABLE rank_blocks")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    if (not existed and not one_table) or not stepped:
        # No blocks yet, or none of the step series: every block built again, once.
        con.execute(
            f"INSERT INTO stale_blocks SELECT DISTINCT series_id, step // {BASE} * {BASE}"
            " FROM rank_points EXCEPT SELECT series_id, start FROM stale_blocks"
        )
    if not existed and not one_table:
        con.execute(
            "INSERT INTO outlier_rows SELECT series_id, step, rank, local_rank, value, delta,"
            f" z, robust_z FROM rank_points WHERE {IS_OUTLIER}"
        )


def recompute(engine: Engine, stale: dict[int, list[int]], last: dict[int, int]) -> None:
    """Rebuild these level-1 blocks (by series) from their points, and their ancestors
    from their children: two statements per level, whatever the number of series, and
    the step series' blocks of the same intervals (``_step_blocks``).

    A block that ends after its series' ``last`` step is left unbuilt: a summary's cover
    never uses it (it uses only blocks that end within the steps present), and the write
    that takes the series past it marks stale the level-1 block that held the series'
    newest step (``DuckDBPoints._mark_blocks``), whose ancestors it is among, so it is
    built once, complete, instead of rewritten at every level after every write."""
    con = engine.con
    sids = np.concatenate([np.full(len(s), sid, dtype=np.int32) for sid, s in stale.items()])
    level_one = np.concatenate([np.asarray(s, dtype=np.int64) for s in stale.values()])
    newest = np.array([last.get(int(sid), -1) for sid in stale], dtype=np.int64)
    ends = np.repeat(newest, [len(s) for s in stale.values()])
    rebuilt: list[np.ndarray] = []  # per level from 1: the (series, start) pairs rebuilt
    for level in range(1, LEVELS + 1):
        size = BASE**level
        complete = level_one // size * size + size - 1 <= ends
        if not complete.any():
            break  # a block's ancestors end no sooner than it does
        pairs, _ = covers.unique_pairs(sids[complete], level_one[complete] // size * size)
        frame = {"series_id": pairs[0].astype(np.int32), "start": pairs[1]}
        span = [int(pairs[0].min()), int(pairs[0].max()), int(pairs[1].min()), int(pairs[1].max())]
        with engine.frame("rebuilt", frame) as (source, params):
            con.execute(
                f"DELETE FROM {table(level)} b USING {source} WHERE b.series_id = rebuilt.series_id"
                " AND b.start = rebuilt.start"
                " AND b.series_id BETWEEN ? AND ? AND b.start BETWEEN ? AND ?",
                [*params, *span],
            )
        with engine.frame("rebuilt", frame) as (source, params):
            if level == 1:
                con.execute(
                    f"INSERT INTO {table(1)} SELECT p.series_id, p.start, p.rank, {POINT_SUMS}"
                    f" FROM (SELECT r.*, rebuilt.start FROM rank_points r JOIN {source}"
                    f" ON r.series_id = rebuilt.series_id AND r.step // {BASE} * {BASE} ="
                    " rebuilt.start WHERE r.series_id BETWEEN ? AND ?"
                    f" AND r.step BETWEEN ? AND ? + {BASE - 1}) p"
                    " GROUP BY p.series_id, p.start, p.rank",
                    [*params, *span],
                )
            else:
                con.execute(
                    f"INSERT INTO {table(level)} SELECT p.series_id, p.parent, p.rank,"
                    f" {BLOCK_SUMS} FROM (SELECT c.*, rebuilt.start AS parent"
                    f" FROM {table(level - 1)} c JOIN {source} ON c.series_id = rebuilt.series_id"
                    f" AND c.start // {size} * {size} = rebuilt.start"
                    f" WHERE c.series_id BETWEEN ? AND ? AND c.start BETWEEN ? AND ? + {size - 1}) p"
                    " GROUP BY p.series_id, p.parent, p.rank",
                    [*params, *span],
                )
        rebuilt.append(pairs)
    if rebuilt:
        _step_blocks(engine, rebuilt)
    frame = {"series_id": sids, "start": level_one}
    with engine.frame("rebuilt", frame) as (source, params):
        con.execute(
            f"DELETE FROM stale_blocks USING {source}"
            " WHERE stale_blocks.series_id = rebuilt.series_id"
            " AND stale_blocks.start = rebuilt.start",
            params,
        )


def _step_blocks(engine: Engine, rebuilt: list[np.ndarray]) -> None:
    """The step blocks at these (series, start) pairs, level by level from 1, rebuilt:
    level 1 from the step rows, each level above from its children (those rebuilt here,
    and the others as kept), combined by ``rankmath.step_blocks`` (the one definition).
    Four statements whatever the levels: the step rows, the children kept, one delete and
    one insert."""
    con = engine.con
    ones = rebuilt[0]
    frame = {"series_id": ones[0].astype(np.int32), "start": ones[1]}
    span = [int(ones[0].min()), int(ones[0].max()), int(ones[1].min()), int(ones[1].max())]
    with engine.frame("rebuilt", frame) as (source, params):
        found = con.execute(
            f"SELECT s.series_id, rebuilt.start AS parent, {', '.join('s.' + c for c in STEP_COLUMNS)}"
            f" FROM step_stats s JOIN {source} ON s.series_id = rebuilt.series_id"
            f" AND s.step // {BASE} * {BASE} = rebuilt.start WHERE s.series_id BETWEEN ? AND ?"
            f" AND s.step BETWEEN ? AND ? + {BASE - 1}",
            [*params, *span],
        ).fetchnumpy()
    stats = {c: np.ma.filled(np.ma.asarray(found[c]), np.nan) for c in STEP_COLUMNS}
    # The children of each level above the first that this rebuild leaves as they are.
    kept_keys = []
    for level in range(2, len(rebuilt) + 1):
        parents, own = rebuilt[level - 1], rebuilt[level - 2]
        child = BASE ** (level - 1)
        sids = np.repeat(parents[0], BASE)
        starts = (parents[1][:, None] + child * np.arange(BASE)).ravel()
        fresh = covers.among(sids, starts, own)
        kept_keys.append((level - 1, sids[~fresh], starts[~fresh]))
    kept_frame = {
        "series_id": np.concatenate([k[1] for k in kept_keys] or [np.empty(0, np.int64)]).astype(
            np.int32
        ),
        "level": np.concatenate(
            [np.full(len(k[1]), k[0], dtype=np.int8) for k in kept_keys] or [np.empty(0, np.int8)]
        ),
        "start": np.concatenate([k[2] for k in kept_keys] or [np.empty(0, np.int64)]),
    }
    kept: dict[str, np.ndarray] = {}
    if len(kept_frame["start"]):
        with engine.frame("kept", kept_frame) as (source, params):
            kept = con.execute(
                f"SELECT c.series_id, c.level, c.start, {', '.join('c.' + c for c in step_blocks.FIELDS)}"
                f" FROM step_blocks c JOIN {source} ON c.series_id = kept.series_id"
                " AND c.level = kept.level AND c.start = kept.start",
                params,
            ).fetchnumpy()
    out: list[dict[str, np.ndarray]] = []
    below = (
        np.asarray(found["series_id"], dtype=np.int64),
        np.asarray(found["parent"], dtype=np.int64),
        step_blocks.of_steps(stats),
    )
    for level in range(1, len(rebuilt) + 1):
        sids, parents, rows = below
        if level > 1:
            size = BASE**level
            if kept:
                mine = np.asarray(kept["level"]) == level - 1
                sids = np.concatenate([sids, np.asarray(kept["series_id"], np.int64)[mine]])
                parents = np.concatenate([parents, np.asarray(kept["start"], np.int64)[mine]])
                rows = step_blocks.concat(
                    [rows, {c: np.asarray(kept[c])[mine] for c in step_blocks.FIELDS}]
                )
            parents = parents // size * size
            # Only the parents rebuilt at this level: a complete child's parent may not be.
            wanted = covers.among(sids, parents, rebuilt[level - 1])
            sids, parents = sids[wanted], parents[wanted]
            rows = {c: rows[c][wanted] for c in step_blocks.FIELDS}
        if not len(sids):  # no steps under this level's blocks: none to write
            below = (sids, parents, rows)
            continue
        pairs, group = covers.unique_pairs(sids, parents)
        keys, combined = step_blocks.combine(group, rows)
        out.append({
            "series_id": pairs[0][keys].astype(np.int32),
            "level": np.full(len(keys), level, dtype=np.int8),
            "start": pairs[1][keys],
            **{name: combined[name] for name in step_blocks.FIELDS},
        })  # fmt: skip
        below = (pairs[0][keys], pairs[1][keys], combined)
    gone = {
        "series_id": np.concatenate([p[0] for p in rebuilt]).astype(np.int32),
        "level": np.concatenate(
            [np.full(p.shape[1], k, dtype=np.int8) for k, p in enumerate(rebuilt, 1)]
        ),
        "start": np.concatenate([p[1] for p in rebuilt]),
    }
    with engine.frame("gone", gone) as (source, params):
        con.execute(
            f"DELETE FROM step_blocks b USING {source} WHERE b.series_id = gone.series_id"
            " AND b.level = gone.level AND b.start = gone.start",
            params,
        )
    if out:
        rows_out = {name: np.concatenate([o[name] for o in out]) for name in out[0]}
        listed = ", ".join(rows_out)
        with engine.frame("step_block_rows", rows_out) as (source, params):
            con.execute(f"INSERT INTO step_blocks ({listed}) SELECT {listed} FROM {source}", params)


def covering(levels: np.ndarray, starts: np.ndarray, columns: str) -> str | None:
    """SQL for the block rows of the registered ``pieces`` (``level, start, b``) of a
    series (``$sid``): ``b`` and ``columns`` (of the block tables, ``r.``-prefixed), one
    branch a level present, each finding its rows by that level's starts alone, written
    as constants (a short list, or the range of a long one) so that the zone maps of
    ``start`` skip the row groups outside them. None when there are no blocks."""
    present = sorted({int(level) for level in levels})
    if not present:
        return None
    branches = []
    for level in present:
        mine = np.unique(starts[levels == level])
        if len(mine) <= _LISTED_STARTS:
            found = f"r.start IN ({', '.join(str(int(s)) for s in mine)})"
        else:
            found = (
                f"r.start BETWEEN {int(mine[0])} AND {int(mine[-1])}"
                f" AND r.start IN (SELECT start FROM pieces WHERE level = {level})"
            )
        branches.append(
            f"SELECT p.b, {columns} FROM {table(level)} r JOIN pieces p"
            f" ON p.level = {level} AND p.start = r.start WHERE r.series_id = $sid AND {found}"
        )
    return " UNION ALL ".join(branches)


_LISTED_STARTS = 64  # a level's starts written out one by one up to this many
