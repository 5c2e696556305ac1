"""Block rows in ClickHouse (what a block is: :mod:`instantml.rankmath.covers`): insert-only
rows per (series, level, start[, rank]), the newest version of each read with ``FINAL``;
the rank blocks (``rank_blocks``) and the step series' blocks (``step_blocks``) alike.

A step refresh recomputes whole level-1 blocks (it reads every point and step row of the
blocks its steps are in) and writes them; then every ancestor, of every level, from one
read of the children it does not recompute (level 1 as stored, those above as kept), in
one insert a table. Statements, not rows, are what a write costs here (each insert is a
part), so a refresh is five statements a table and one check whatever the levels.

Two processes may refresh blocks under one parent at once: each could read the other's
child before the other wrote it. So after its insert a refresh checks, in one query,
that every child it read is still the newest version of its block and that every
ancestor it wrote is still the newest of its own; if not, it reads and writes again with
a newer version. Of two overlapping refreshes the one that checks later sees the other's
rows (each inserts before it checks), so it either finds them current or rebuilds over
them: the newest ancestor was made from the newest children.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...rankmath import covers as blocks
from ...rankmath import step_blocks
from ...rankmath.covers import BASE, LEVELS
from .engine import ChEngine

_TYPES = {
    "rank": np.int16, "n": np.uint32, "marks": np.uint32, "total": np.float64,
    "last_step": np.int64, "sum_delta": np.float64, "sum_abs_z": np.float64,
    "outliers": np.uint32, "lr_step": np.int64, "local_rank": np.int16,
}  # fmt: skip
# Rebuilding the ancestors again while another refresh keeps changing their children:
# past this, the steps stay stale for a later refresh.
_TRIES = 4


def level_one_steps(steps: list[int]) -> list[int]:
    """Every step of the level-1 blocks these steps are in."""
    starts = blocks.level_one(np.asarray(steps, dtype=np.int64))
    return (starts[:, None] + np.arange(BASE)).ravel().tolist()


def rebuild(
    engine: ChEngine,
    points: dict[int, blocks.Rows],
    stats: dict[int, dict[str, np.ndarray]],
    version: int,
) -> bool:
    """Write the level-1 rank blocks of these points and step blocks of these step rows
    (per series: every point, every step row, of those blocks; ``version``: when they were
    read), then recompute every ancestor of both. False when other refreshes kept changing
    the same blocks through every try: the ancestors may be behind, rebuild them later."""
    plans = []
    if points:
        plans.append(_Plan(_RANK, [
            (sid, *blocks.combine(rows["last_step"] // BASE * BASE, rows))
            for sid, rows in points.items()
        ]))  # fmt: skip
    if stats:
        parts = []
        for sid, rows in stats.items():
            of_steps = step_blocks.of_steps(rows)
            parts.append(
                (sid, *step_blocks.combine(of_steps["first_step"] // BASE * BASE, of_steps))
            )
        plans.append(_Plan(_STEP, parts))
    plans = [plan for plan in plans if plan.parts]
    for plan in plans:
        plan.insert_level_one(engine, version)
    if not plans:
        return True
    for _ in range(_TRIES):
        upper = engine.version()  # before reading the children
        for plan in plans:
            plan.read(engine)
        for plan in plans:
            plan.write(engine, upper)
        if _settled(engine, plans):
            return True
    return False


class _Kind:
    """A kind of block row: its table, columns and types, and how rows combine."""

    def __init__(
        self,
        table: str,
        fields: tuple[str, ...],
        types: dict[str, Any],
        combine: Callable[
            [np.ndarray, dict[str, np.ndarray]], tuple[np.ndarray, dict[str, np.ndarray]]
        ],
    ) -> None:
        self.table, self.fields, self.types, self.combine = table, fields, types, combine

    def rows(self, found: Any) -> dict[str, np.ndarray]:
        """Fetched columns as rows that combine (floats and int64s)."""
        return {
            name: np.asarray(found[name]).astype(
                np.float64 if self.types[name] is np.float64 else np.int64
            )
            for name in self.fields
        }


_RANK = _Kind("rank_blocks", blocks.FIELDS, _TYPES, blocks.combine)
_STEP = _Kind(
    "step_blocks",
    step_blocks.FIELDS,
    {name: np.int64 if name in step_blocks.INTS else np.float64 for name in step_blocks.FIELDS},
    step_blocks.combine,
)


class _Plan:
    """One kind's rebuild: the level-1 rows made from points or step rows, the ancestors'
    (series, start) pairs by level, and the children to read for them: every level-1 block
    under a level-2 ancestor (this refresh's own as stored: another may have written a
    newer one), and above, the children this refresh does not recompute."""

    def __init__(self, kind: _Kind, parts: list[tuple[int, np.ndarray, dict[str, np.ndarray]]]):
        self.kind = kind
        self.parts = [(sid, group, rows) for sid, group, rows in parts if len(group)]
        none = np.empty(0, dtype=np.int64)
        own = blocks.unique_pairs(
            np.concatenate([none, *(np.full(len(g), sid) for sid, g, _ in self.parts)]),
            np.concatenate([none, *(g for _, g, _ in self.parts)]),
        )[0]
        self.own = [own]  # per level from 1: the (series, start) pairs rebuilt
        for level in range(2, LEVELS + 1):
            size = BASE**level
            self.own.append(blocks.unique_pairs(own[0], own[1] // size * size)[0])
            own = self.own[-1]
        reads = []
        for level in range(2, LEVELS + 1):
            parents, child = self.own[level - 1], BASE ** (level - 1)
            sids = np.repeat(parents[0], BASE)
            starts = (parents[1][:, None] + child * np.arange(BASE)).ravel()
            if level > 2:
                kept = ~blocks.among(sids, starts, self.own[level - 2])
                sids, starts = sids[kept], starts[kept]
            reads.append(np.stack([sids, np.full(len(sids), level - 1), starts]))
        self.reads = (
            np.concatenate(reads, axis=1) if own.shape[1] else np.empty((3, 0), dtype=np.int64)
        )
        self.found: Any = None
        self.written = np.empty((3, 0), dtype=np.int64)
        self.upper = 0

    def insert_level_one(self, engine: ChEngine, version: int) -> None:
        sids = [np.full(len(group), sid, dtype=np.uint64) for sid, group, _ in self.parts]
        _insert(
            engine,
            self.kind,
            {
                "series_id": np.concatenate(sids),
                "level": np.ones(sum(len(s) for s in sids), dtype=np.uint8),
                "start": np.concatenate([group for _, group, _ in self.parts]),
                **{
                    name: np.concatenate([rows[name] for _, _, rows in self.parts])
                    for name in self.kind.fields
                },
            },
            version,
        )

    def read(self, engine: ChEngine) -> None:
        """The newest version of every child to read, with its version."""
        found = engine.query_np(
            f"SELECT series_id, level, start, version, {', '.join(self.kind.fields)}"
            f" FROM {engine.table(self.kind.table)} FINAL WHERE {_keys_in(self.reads)}"
        )
        self.found = {
            "series_id": np.asarray(found["series_id"] if len(found) else [], dtype=np.int64),
            "level": np.asarray(found["level"] if len(found) else [], dtype=np.int64),
            "start": np.asarray(found["start"] if len(found) else [], dtype=np.int64),
            "version": np.asarray(found["version"] if len(found) else [], dtype=np.uint64),
            **self.kind.rows(found if len(found) else _empty(self.kind.fields)),
        }

    def write(self, engine: ChEngine, upper: int) -> None:
        """Every ancestor, level by level from the children read and the ones made here,
        in one insert stamped ``upper``."""
        found, kind = self.found, self.kind
        levels, sids_found, starts_found = found["level"], found["series_id"], found["start"]
        rows_found = {name: found[name] for name in kind.fields}
        below = (np.empty(0, np.int64), np.empty(0, np.int64), {
            name: np.empty(0, rows_found[name].dtype) for name in kind.fields
        })  # fmt: skip
        out = []
        for level in range(2, LEVELS + 1):
            mine = levels == level - 1
            sids = np.concatenate([below[0], sids_found[mine]])
            starts = np.concatenate([below[1], starts_found[mine]])
            rows = {name: np.concatenate([below[2][name], rows_found[name][mine]])
                    for name in kind.fields}  # fmt: skip
            size = BASE**level
            pairs, group = blocks.unique_pairs(sids, starts // size * size)
            keys, combined = kind.combine(group, rows)
            below = (pairs[0][keys], pairs[1][keys], combined)
            out.append((level, below))
        self.upper = upper
        self.written = np.concatenate(
            [_at_level(blocks.unique_pairs(s, t)[0], level) for level, (s, t, _) in out],
            axis=1,
        )  # fmt: skip
        _insert(
            engine,
            kind,
            {
                "series_id": np.concatenate([s for _, (s, _, _) in out]).astype(np.uint64),
                "level": np.concatenate(
                    [np.full(len(s), level, dtype=np.uint8) for level, (s, _, _) in out]
                ),
                "start": np.concatenate([t for _, (_, t, _) in out]),
                **{
                    name: np.concatenate([rows[name] for _, (_, _, rows) in out])
                    for name in kind.fields
                },
            },
            upper,
        )

    def expected(self) -> dict[tuple[int, int, int], int]:
        """What the check should find: each child read at the version read (absent: 0),
        each ancestor written at this write's version."""
        found = self.found
        versions: dict[tuple[int, int, int], int] = dict.fromkeys(
            zip(*(self.reads[i].tolist() for i in range(3)), strict=True), 0
        )
        for key in zip(
            found["series_id"].tolist(), found["level"].tolist(), found["start"].tolist(),
            found["version"].tolist(), strict=True,
        ):  # fmt: skip
            versions[key[:3]] = max(versions[key[:3]], int(key[3]))
        versions.update(
            dict.fromkeys(zip(*(self.written[i].tolist() for i in range(3)), strict=True),
                          self.upper)
        )  # fmt: skip
        return versions


def _keys_in(keys: np.ndarray) -> str:
    """SQL for these (series, level, start) keys (a 3 x n array), as three literal arrays
    of numbers this code made (bound as parameters, or as a literal list of tuples,
    thousands of keys cost more to bind or to parse than the query), the series and the
    starts' range first so that the primary key (series_id, level, start[, rank]) skips
    the granules outside them."""
    s, level, t = (",".join(map(str, keys[i].tolist())) for i in range(3))
    sids = ",".join(map(str, np.unique(keys[0]).tolist()))
    return (
        f"series_id IN ({sids}) AND start BETWEEN {int(keys[2].min())} AND {int(keys[2].max())}"
        " AND (series_id, level, start) IN (SELECT arrayJoin(arrayZip("
        f"CAST([{s}] AS Array(UInt64)), CAST([{level}] AS Array(UInt8)),"
        f" CAST([{t}] AS Array(Int64)))))"
    )


def _empty(fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {name: np.empty(0) for name in fields}


def _settled(engine: ChEngine, plans: list[_Plan]) -> bool:
    """Whether every child each plan read is still the newest of its block, and every
    ancestor it wrote still the newest of its own (one query for every plan)."""
    expected = [plan.expected() for plan in plans]
    branches = [
        f"SELECT {i} AS plan, series_id, level, start, max(version) AS newest"
        f" FROM {engine.table(plan.kind.table)}"
        f" WHERE {_keys_in(np.array(list(wanted), dtype=np.int64).T)}"
        " GROUP BY series_id, level, start"
        for i, (plan, wanted) in enumerate(zip(plans, expected, strict=True))
    ]
    found: dict[tuple[int, int, int, int], int] = {
        (int(i), int(sid), int(level), int(start)): int(newest)
        for i, sid, level, start, newest in engine.rows(" UNION ALL ".join(branches))
    }
    return all(
        found.get((i, *key), 0) == version
        for i, wanted in enumerate(expected)
        for key, version in wanted.items()
    )


def read(
    engine: ChEngine,
    sid: int,
    pieces: blocks.Pieces,
    fields: tuple[str, ...],
    table: str = "rank_blocks",
) -> tuple[blocks.Rows, np.ndarray]:
    """The rows (``fields``) of the pieces' blocks in ``table``, and each row's group."""
    listed = pieces.blocks()
    if not len(listed["start"]):
        return {name: np.empty(0) for name in fields}, np.empty(0, dtype=np.int64)
    # The pieces' (level, start) pairs, as a literal set (numbers this code made): the
    # primary key (series_id, level, start[, rank]) finds their granules.
    pairs = ",".join(
        f"({level},{start})"
        for level, start in zip(listed["level"].tolist(), listed["start"].tolist())
    )
    found = engine.query_np(
        f"SELECT level, start, {', '.join(fields)} FROM {engine.table(table)} FINAL"
        f" WHERE series_id = {{sid:UInt64}} AND (level, start) IN ({pairs})",
        {"sid": sid},
    )
    if not len(found):
        return {name: np.empty(0) for name in fields}, np.empty(0, dtype=np.int64)
    key = listed["start"] * 16 + listed["level"]
    order = np.argsort(key)
    at = np.searchsorted(
        key[order], found["start"].astype(np.int64) * 16 + found["level"].astype(np.int64)
    )
    group = listed["b"][order][at].astype(np.int64)
    return {name: np.asarray(found[name]) for name in fields}, group


def read_steps(
    engine: ChEngine, sid: int, pieces: blocks.Pieces
) -> tuple[step_blocks.Rows, np.ndarray]:
    """The step block rows of the pieces' blocks, and each row's group."""
    found, group = read(engine, sid, pieces, step_blocks.FIELDS, "step_blocks")
    return {name: found[name].astype(_STEP.types[name]) for name in step_blocks.FIELDS}, group


def as_rows(found: Any) -> blocks.Rows:
    """Fetched block columns (a record array or a dict of them) as Rows."""
    return _RANK.rows(found)


def _insert(engine: ChEngine, kind: _Kind, columns: dict[str, np.ndarray], version: int) -> None:
    """One insert of block rows (``series_id, level, start`` and the kind's fields)."""
    if not len(columns["start"]):
        return
    engine.insert(
        kind.table,
        {
            "series_id": columns["series_id"].astype(np.uint64),
            "level": columns["level"].astype(np.uint8),
            "start": columns["start"].astype(np.int64),
            **{name: columns[name].astype(kind.types[name]) for name in kind.fields},
            "version": np.full(len(columns["start"]), version, dtype=np.uint64),
        },
    )


def _at_level(pairs: np.ndarray, level: int) -> np.ndarray:
    """(series, start) pairs as (series, level, start) rows of a 3 x n array."""
    return np.stack([pairs[0], np.full(pairs.shape[1], level, dtype=np.int64), pairs[1]])
