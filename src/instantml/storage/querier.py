"""The querier: the rows of a Distributed summary, read from a point engine's tables.

One flow for every engine: the step rows of the range; the heatmap's bucket size (the
bucket rule, :func:`instantml.rankmath.params.bucket_size`, applied here once); the cells
and the rollup as sums of block rows and single steps' points (the covers of
:mod:`instantml.rankmath.covers`) or, for a non-default z (the blocks keep outlier counts
for the default z only), of every point of the range; the strongest outlier rows; each
rank's first non-finite value. The engine answers narrow table reads
(:class:`SummaryTables`); every figure is computed by ``rankmath``.

A read is a generator that yields before each of its larger reads: whoever drives it (the
server, which lets queued writes go first there) decides what happens in between; the
store is never handed a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

import numpy as np

from ..rankmath import covers, step_blocks
from ..rankmath.params import ROBUST_Z_THRESHOLD, SummaryParams, bucket_size
from ..rankmath.rows import SummaryRows

Reading = Generator[None, None, SummaryRows]
# The step rows' columns, as every engine returns them (one row per step, in step order).
STEP_COLUMNS = ("step", "n", "expected", "mean", "weighted_mean", "min", "max", "std", "p05",
                "p50", "p95", "nonfinite")  # fmt: skip
# Cell sums: ``rank, n, total, marks`` (one row per block, point or group of them), with
# each row's heatmap bucket beside them.
CellSums = tuple[dict[str, np.ndarray], np.ndarray]
CELL_SUMS = ("rank", "n", "total", "marks")


class SummaryTables(Protocol):
    """The table reads a summary is made of, on one engine."""

    # Cells are read from the range's points instead of its cover when the points are at
    # most this many times the cover's rows (a zoom whose buckets are a few steps wide);
    # 0: always from the cover.
    scan_ratio: float

    def snapshot(self) -> AbstractContextManager[Any]:
        """The reads within it see one state of the tables (where the engine has one)."""
        ...

    def world_size(self, series_id: int) -> int:
        """The largest world size of any step of the series (0: none)."""
        ...

    def step_span(self, series_id: int, lo: int, hi: int) -> tuple[int, int, int]:
        """``(count, first, last)`` of the present steps in ``lo``-``hi`` (count 0: none)."""
        ...

    def step_rows(self, series_id: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The step rows of steps ``lo``-``hi`` (columns ``STEP_COLUMNS``), by step."""
        ...

    def step_rows_at(self, series_id: int, steps: np.ndarray) -> dict[str, np.ndarray]:
        """The step rows of these steps (those present), by step."""
        ...

    def step_block_rows(
        self, series_id: int, pieces: covers.Pieces
    ) -> tuple[step_blocks.Rows, np.ndarray]:
        """The step block rows (``step_blocks.FIELDS``) of the pieces' blocks, and each
        one's group."""
        ...

    def next_steps(self, series_id: int, after: list[int]) -> dict[int, int]:
        """For each of these steps, the series' first present step after it (absent when
        none)."""
        ...

    def stale_blocks(self, series_id: int) -> np.ndarray:
        """The sorted starts of the level-1 blocks whose rows are behind their points:
        read as points (an engine that rebuilds them before every read has none)."""
        ...

    def point_cell_sums(self, series_id: int, lo: int, hi: int, size: int) -> CellSums:
        """Cell sums of every point of steps ``lo``-``hi``, bucket ``step // size``
        (``covers.bucket_keys``)."""
        ...

    def cover_rows(self, series_id: int, pieces: covers.Pieces) -> tuple[covers.Rows, np.ndarray]:
        """The block rows and single steps' points of the pieces, as rows
        (``covers.FIELDS``), and each row's group (``b``)."""
        ...

    def range_rollup(
        self, series_id: int, lo: int, hi: int, z: float, robust_z: float
    ) -> covers.Rows:
        """Per rank, the sums of its points in steps ``lo``-``hi`` as rows
        (``covers.FIELDS``; outliers counted at these thresholds)."""
        ...

    def outliers(
        self, series_id: int, lo: int, hi: int, params: SummaryParams, kept: bool
    ) -> list[tuple[Any, ...]]:
        """The strongest outlier rows (``SummaryRows.outliers``) of steps ``lo``-``hi`` at
        ``params.z`` (``kept``: the default z, whose rows the engine keeps)."""
        ...

    def first_nonfinite(self, series_id: int, lo: int, hi: int) -> dict[int, tuple[int, float]]:
        """Per rank with a non-finite value in steps ``lo``-``hi``: its first such step and
        the value."""
        ...


def read(tables: SummaryTables, series_id: int, params: SummaryParams) -> Reading:
    """The rows of one key's summary over the params' range (a generator: see above)."""
    lo = params.step_min if params.step_min is not None else 0
    hi = params.step_max if params.step_max is not None else 2**63 - 1
    yield
    with tables.snapshot():
        found = SummaryRows(tables.world_size(series_id))
        count, first, last = tables.step_span(series_id, lo, hi)
        if not count:
            return found
        found.span = (first, last)
        found.band_size = size = bucket_size(first, last, count, params.max_points)
        found.heat_size = heat = bucket_size(first, last, count, params.heatmap_steps)
        stale = tables.stale_blocks(series_id)
        present: np.ndarray | None = None
        if size == 1 or heat == 1 or covers.sparse(first, last, count):
            # Few steps (or far apart): their rows are the cheaper read.
            stats = tables.step_rows(series_id, first, last)
            present = stats["step"]
            rows = step_blocks.of_steps(stats)
            band = step_blocks.combine(covers.bucket_keys(present, size), rows)[1]
            heat_keys, heat_rows = step_blocks.combine(covers.bucket_keys(present, heat), rows)
            found.last_expected = int(stats["expected"][-1])
        else:
            # Each full bucket is one step block; only the two edge buckets (and blocks
            # still stale) are read as step rows: the rows read follow the buckets, not
            # the run's length.
            band = _bucket_rows(tables, series_id, first, last, size, stale)[1]
            if heat % size == 0:
                heat_keys, heat_rows = step_blocks.combine(band["first_step"] // heat, band)
            else:
                heat_keys, heat_rows = _bucket_rows(tables, series_id, first, last, heat, stale)
            found.last_expected = int(
                tables.step_rows_at(series_id, np.array([last]))["expected"][0]
            )
        found.band = step_blocks.entries(band)
        found.heat_keys = heat_keys
        found.heat_spans = np.column_stack([heat_rows["first_step"], heat_rows["last_step"]])
        found.full_steps = int(heat_rows["full_steps"].sum())
        found.partial_steps = int(heat_rows["steps"].sum()) - found.full_steps
        marked = bool(heat_rows["nonfinite"].sum())
        kept = params.z == covers.DEFAULT_Z
        if kept:
            # A bucket aligned to a block is that one block; only the range's two edge
            # buckets take a few blocks per level and single steps. The rows read grow
            # with the buckets and the ranks, not the run's length.
            pieces = covers.buckets(first, last, heat, present, stale)
            points = int(heat_rows["points"].sum() + heat_rows["nonfinite"].sum())
            cover = (len(pieces.starts) + len(pieces.steps)) * max(found.world_size, 1)
            yield
            if points <= tables.scan_ratio * cover:
                found.cells = covers.cells(*tables.point_cell_sums(series_id, first, last, heat))
                yield
                whole = covers.whole(first, last, present, stale)
                found.rollup = covers.rollup(tables.cover_rows(series_id, whole)[0])
            else:
                # The buckets' cover is the range's too: one read gives the cells and,
                # summed per rank, the rollup.
                rows, group = tables.cover_rows(series_id, pieces)
                found.cells = covers.cells(rows, group)
                found.rollup = covers.rollup(rows)
        else:
            yield
            found.rollup = covers.rollup(
                tables.range_rollup(series_id, lo, hi, params.z, ROBUST_Z_THRESHOLD)
            )
            found.cells = covers.cells(*tables.point_cell_sums(series_id, lo, hi, heat))
        yield
        found.outliers = tables.outliers(series_id, lo, hi, params, kept)
        if marked:
            found.nonfinite_firsts = tables.first_nonfinite(series_id, lo, hi)
        # Where each rank absent from the last step went missing: the first step after
        # its last report.
        last_seen = (
            (cast(int, r[0]), cast(int, r[2])) for r in found.rollup
        )  # (rank, its last step)
        gone = sorted(
            {seen for rank, seen in last_seen if rank < found.last_expected and seen != last}
        )
        if gone and present is not None:
            after = np.searchsorted(present, gone, side="right")
            found.next_step = {s: int(present[a]) for s, a in zip(gone, after.tolist())}
        elif gone:
            found.next_step = tables.next_steps(series_id, gone)
    return found


def _bucket_rows(
    tables: SummaryTables,
    series_id: int,
    first: int,
    last: int,
    size: int,
    stale: np.ndarray,
) -> tuple[np.ndarray, step_blocks.Rows]:
    """The step block rows of the buckets of ``size`` steps of ``[first, last]``, one per
    bucket that holds a step: its blocks' rows and its single steps' rows combined."""
    pieces = covers.buckets(first, last, size, None, stale)
    rows, group = tables.step_block_rows(series_id, pieces)
    singles = pieces.singles()
    stats = tables.step_rows_at(series_id, singles["step"])
    single_rows = step_blocks.of_steps(stats)
    # Each present single step's bucket: its own number, as the pieces grouped it.
    single_group = covers.bucket_keys(stats["step"], size)
    return step_blocks.combine(
        np.concatenate([group, single_group]), step_blocks.concat([rows, single_rows])
    )


def drive(reading: Reading, pause: Callable[[], None] | None = None) -> SummaryRows:
    """Run a read to its end, calling ``pause`` where it yields."""
    while True:
        try:
            next(reading)
        except StopIteration as done:
            return done.value
        if pause is not None:
            pause()
