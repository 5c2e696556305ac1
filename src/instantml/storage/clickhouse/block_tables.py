"""Block rows in ClickHouse (what a block is: :mod:`instantml.rankmath.covers`): insert-only
rows per (series, level, start, rank), the newest version of each read with ``FINAL``.

A step refresh recomputes whole level-1 blocks (it reads every point of the blocks its
steps are in), writes them, then each ancestor from its children, level by level. Each
level's rows carry the version taken *before* reading what they are computed from; a
refresh inserts its children before reading them for the parent, so of two processes
refreshing blocks under one parent at once, the one that read later saw both children,
and its parent wins whichever finishes last (the same rule as the step rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...rankmath import covers as blocks
from ...rankmath import step_blocks
from ...rankmath.covers import BASE, LEVELS
from .engine import ChEngine

_FIELDS = ", ".join(blocks.FIELDS)
_TYPES = {
    "rank": np.int16, "n": np.uint32, "marks": np.uint32, "total": np.float64,
    "last_step": np.int64, "sum_delta": np.float64, "sum_abs_z": np.float64,
    "outliers": np.uint32, "lr_step": np.int64, "local_rank": np.int16,
}  # fmt: skip


def level_one_steps(steps: list[int]) -> list[int]:
    """Every step of the level-1 blocks these steps are in."""
    starts = blocks.level_one(np.asarray(steps, dtype=np.int64))
    return (starts[:, None] + np.arange(BASE)).ravel().tolist()


def rebuild(engine: ChEngine, points: dict[int, blocks.Rows], version: int) -> None:
    """Write the level-1 blocks of these points (per series: every point of those blocks,
    scored) and recompute their ancestors, level by level: one query and one insert a
    level for all the series together (a refresh of 150 keys is ~20 round trips, not
    ~2,000, and adds a part a level to ``rank_blocks``, not one a key and level)."""
    parts = []
    for sid, rows in points.items():
        group, combined = blocks.combine(rows["last_step"] // BASE * BASE, rows)
        parts.append((sid, group, combined))
    _levels(engine, _RANK, parts, version)


def rebuild_steps(engine: ChEngine, stats: dict[int, dict[str, np.ndarray]], version: int) -> None:
    """Write the level-1 step blocks of these step rows (per series: every step of those
    blocks) and recompute their ancestors, as :func:`rebuild` does the rank blocks."""
    parts = []
    for sid, rows in stats.items():
        of_steps = step_blocks.of_steps(rows)
        group, combined = step_blocks.combine(of_steps["first_step"] // BASE * BASE, of_steps)
        parts.append((sid, group, combined))
    _levels(engine, _STEP, parts, version)


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


_RANK = _Kind("rank_blocks", blocks.FIELDS, _TYPES, blocks.combine)
_STEP = _Kind(
    "step_blocks",
    step_blocks.FIELDS,
    {name: np.int64 if name in step_blocks.INTS else np.float64 for name in step_blocks.FIELDS},
    step_blocks.combine,
)


def _levels(
    engine: ChEngine,
    kind: _Kind,
    parts: list[tuple[int, np.ndarray, dict[str, np.ndarray]]],
    version: int,
) -> None:
    """Insert these level-1 rows, then each ancestor level from its children."""
    _insert(engine, kind, 1, parts, version)
    starts = {sid: np.unique(group) for sid, group, _ in parts}
    fields = ", ".join(kind.fields)
    for level in range(2, LEVELS + 1):
        size = BASE**level
        starts = {sid: np.unique(s // size * size) for sid, s in starts.items() if len(s)}
        if not starts:
            return
        version = engine.version()  # before reading the children
        pairs = [(sid, start) for sid, s in starts.items() for start in s.tolist()]
        children = engine.query_np(
            f"SELECT series_id, start, {fields} FROM {engine.table(kind.table)} FINAL"
            " WHERE series_id IN {sids:Array(UInt64)} AND level = {level:UInt8}"
            " AND start BETWEEN {lo:Int64} AND {hi:Int64}"
            " AND (series_id, intDiv(start, {size:Int64}) * {size:Int64})"
            " IN {pairs:Array(Tuple(UInt64, Int64))}",
            {
                "sids": list(starts), "level": level - 1, "size": size, "pairs": pairs,
                "lo": min(int(s[0]) for s in starts.values()),
                "hi": max(int(s[-1]) for s in starts.values()) + size - 1,
            },
        )  # fmt: skip
        if not len(children):
            return
        of_series = children["series_id"].astype(np.int64)
        level_parts = []
        for sid in np.unique(of_series).tolist():
            mine = children[of_series == sid]
            group = mine["start"].astype(np.int64) // size * size
            rows = {
                name: mine[name].astype(np.float64 if kind.types[name] is np.float64 else np.int64)
                for name in kind.fields
            }
            level_parts.append((sid, *kind.combine(group, rows)))
        _insert(engine, kind, level, level_parts, version)


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
    return {
        name: found[name].astype(
            np.float64 if name in ("total", "sum_delta", "sum_abs_z") else np.int64
        )
        for name in blocks.FIELDS
    }


def _insert(
    engine: ChEngine,
    kind: _Kind,
    level: int,
    parts: list[tuple[int, np.ndarray, dict[str, np.ndarray]]],
    version: int,
) -> None:
    """One insert of every series' block rows at this level: (series id, each row's block
    start, the rows)."""
    engine.insert_series(
        kind.table,
        [
            {
                "series_id": sid,
                "level": np.full(len(group), level, dtype=np.uint8),
                "start": group.astype(np.int64),
                **{name: rows[name].astype(kind.types[name]) for name in kind.fields},
            }
            for sid, group, rows in parts
        ],
        version,
    )
