"""Per-rank sums by block of steps, at several resolutions: the backend-neutral half of
the summary's aggregates. Each point store keeps the rows and finds the points; the
arithmetic of combining them is here, once.

A level-k block is the 4**k steps ``[start, start + 4**k)`` with ``start`` a multiple of
4**k (k = 1 .. LEVELS). Its row per rank holds the sums and extremes of that rank's points
in it: finite values (count and sum), non-finite marks, the last step, the sums of deltas
and |z|, the outlier count at the default thresholds, the latest local rank. Level 0 is
the points themselves. Any step interval is covered exactly by a few blocks per level and
at most a few single steps at its edges (:func:`cover`), so a heatmap cell or a rank's
rollup is a sum of a few rows per rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .params import BLOCK_BASE, ROBUST_Z_THRESHOLD, SummaryParams

BASE = BLOCK_BASE
LEVELS = 8  # blocks of 4, 16, ..., 65,536 steps
DEFAULT_Z = SummaryParams().z  # the z the outlier counts of blocks are kept for
RZ = ROBUST_Z_THRESHOLD

# A block's row per rank, after (series, level, start): the columns of every store.
FIELDS = ("rank", "n", "marks", "total", "last_step", "sum_delta", "sum_abs_z", "outliers",
          "lr_step", "local_rank")  # fmt: skip
_SUMMED = ("n", "marks", "total", "sum_delta", "sum_abs_z", "outliers")
_MAXED = ("last_step", "lr_step")
# Rows: a dict of equal-length numpy columns named FIELDS, one row per (block or point,
# rank). ``lr_step`` and ``local_rank`` are -1 where no local rank was given.
Rows = dict[str, np.ndarray]


def level_one(steps: np.ndarray) -> np.ndarray:
    """The level-1 blocks (their starts) these steps are in."""
    return np.unique(np.asarray(steps, dtype=np.int64) // BASE * BASE)


def of_points(columns: dict[str, np.ndarray], z: float = DEFAULT_Z) -> Rows:
    """Points (``rank, step, value, delta, z, robust_z, local_rank``; a missing score NaN,
    a missing local rank -1) as rows of one step each."""
    value = np.asarray(columns["value"], dtype=np.float64)
    finite = np.isfinite(value)
    delta, zs, robust = (
        np.asarray(columns[k], dtype=np.float64) for k in ("delta", "z", "robust_z")
    )
    local = np.asarray(columns["local_rank"], dtype=np.int64)
    step = np.asarray(columns["step"], dtype=np.int64)
    with np.errstate(invalid="ignore"):
        outlier = (np.isfinite(zs) & (np.abs(zs) >= z)) | (
            np.isfinite(robust) & (np.abs(robust) >= RZ)
        )
    return {
        "rank": np.asarray(columns["rank"], dtype=np.int64),
        "n": finite.astype(np.int64),
        "marks": (~finite).astype(np.int64),
        "total": np.where(finite, value, 0.0),
        "last_step": step,
        "sum_delta": np.where(np.isfinite(delta), delta, 0.0),
        "sum_abs_z": np.where(np.isfinite(zs), np.abs(zs), 0.0),
        "outliers": outlier.astype(np.int64),
        "lr_step": np.where(local >= 0, step, -1),
        "local_rank": np.where(local >= 0, local, -1),
    }  # fmt: skip


def combine(group: np.ndarray, rows: Rows) -> tuple[np.ndarray, Rows]:
    """Rows summed per (group, rank): the group of each result row, and the rows, ordered
    by group then rank. Counts and sums add, the last steps take the largest, the local
    rank is that of the latest point that gave one."""
    if not len(group):
        return group, {name: rows[name][:0] for name in FIELDS}
    order = np.lexsort((rows["lr_step"], rows["rank"], group))
    g, r = group[order], rows["rank"][order]
    starts = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (r[1:] != r[:-1])])
    ends = np.r_[starts[1:], len(g)] - 1
    out = {"rank": r[starts]}
    for name in _SUMMED:
        out[name] = np.add.reduceat(rows[name][order], starts)
    for name in _MAXED:
        out[name] = np.maximum.reduceat(rows[name][order], starts)
    out["local_rank"] = rows["local_rank"][order][ends]  # sorted by lr_step within a group
    return g[starts], out


def concat(parts: Sequence[Rows]) -> Rows:
    return {name: np.concatenate([p[name] for p in parts]) for name in FIELDS}


def cover(first: int, last: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The steps ``[first, last]`` as the fewest aligned blocks: ``(level, start)`` pairs
    and single steps (level 0). Greedy from the left: the largest block that starts here
    and ends within the interval."""
    found: list[tuple[int, int]] = []
    steps: list[int] = []
    at = first
    while at <= last:
        level = 0
        while (
            level < LEVELS
            and at % BASE ** (level + 1) == 0
            and at + BASE ** (level + 1) - 1 <= last
        ):
            level += 1
        if level == 0:
            steps.append(at)
            at += 1
        else:
            found.append((level, at))
            at += BASE**level
    return found, steps


def among(sids: np.ndarray, starts: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Which of these (series, start)s are among the pairs (a 2 x n array)."""
    listed = set(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
    return np.fromiter(
        ((s, t) in listed for s, t in zip(sids.tolist(), starts.tolist(), strict=True)),
        dtype=bool,
        count=len(sids),
    )


def unique_pairs(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (first, second) pairs in order, as a 2 x n int64 array, and the index
    of each input pair among them: what ``np.unique(np.stack([first, second]), axis=1,
    return_inverse=True)`` gives, by a lexsort (unique over an axis sorts the pairs as
    records, about ten times slower)."""
    first, second = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
    order = np.lexsort((second, first))
    a, b = first[order], second[order]
    new = np.ones(len(a), dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    inverse = np.empty(len(a), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return np.stack([a[new], b[new]]), inverse


def bucket_keys(steps: np.ndarray, size: int) -> np.ndarray:
    """Each step's bucket number: buckets aligned to multiples of ``size`` from step 0
    (``rankmath.params.bucket_size``)."""
    return np.asarray(steps, dtype=np.int64) // size


class Pieces:
    """Step intervals, one per group (a heatmap bucket, or the whole range), as aligned
    blocks and single steps."""

    def __init__(self) -> None:
        self.levels: list[int] = []
        self.starts: list[int] = []
        self.block_group: list[int] = []
        self.steps: list[int] = []
        self.step_group: list[int] = []

    def add(
        self,
        group: int,
        lo: int,
        hi: int,
        present: np.ndarray | None = None,
        stale: np.ndarray | None = None,
    ) -> None:
        """The steps ``[lo, hi]`` of one group, of which ``present`` (sorted; None: not
        known, every step may be) are present. The cover is of the interval, not of its
        present steps: a block holds only the points it has, so a bucket aligned to a
        block is that one block whatever steps are absent from it. Steps in a ``stale``
        level-1 block (sorted starts: a block behind its points, or one left unbuilt while
        it was incomplete) are read as single steps; the intervals between such blocks
        are covered apart, so no block used overlaps one."""
        if present is not None:
            present = present[np.searchsorted(present, lo) : np.searchsorted(present, hi, "right")]
        if stale is not None and len(stale):
            inside = stale[(stale + BASE - 1 >= lo) & (stale <= hi)]
            if len(inside):
                if present is None:
                    marked = (inside[:, None] + np.arange(BASE)).ravel()
                    marked = marked[(marked >= lo) & (marked <= hi)]
                else:
                    marked = present[np.isin(present // BASE * BASE, inside)]
                self.steps += marked.tolist()
                self.step_group += [group] * len(marked)
                at = lo
                for start in inside.tolist():
                    if start > at:
                        self._add(group, at, start - 1, present)
                    at = max(at, start + BASE)
                if at <= hi:
                    self._add(group, at, hi, present)
                return
        self._add(group, lo, hi, present)

    def _add(self, group: int, lo: int, hi: int, present: np.ndarray | None) -> None:
        if present is not None:
            present = present[np.searchsorted(present, lo) : np.searchsorted(present, hi, "right")]
            if not len(present):
                return
            if sparse(lo, hi, len(present)):
                # So sparse that its points are fewer than its blocks would be: the points.
                self.steps += present.tolist()
                self.step_group += [group] * len(present)
                return
        covered, single = cover(lo, hi)
        for level, start in covered:
            self.levels.append(level)
            self.starts.append(start)
            self.block_group.append(group)
        if single and present is not None:  # the present ones: the others have no points
            single = np.intersect1d(np.array(single, dtype=np.int64), present).tolist()
        self.steps += single
        self.step_group += [group] * len(single)

    def blocks(self) -> dict[str, np.ndarray]:
        return {
            "level": np.array(self.levels, dtype=np.int8),
            "start": np.array(self.starts, dtype=np.int64),
            "b": np.array(self.block_group, dtype=np.int32),
        }

    def singles(self) -> dict[str, np.ndarray]:
        return {
            "step": np.array(self.steps, dtype=np.int64),
            "b": np.array(self.step_group, dtype=np.int32),
        }


def buckets(
    first: int,
    last: int,
    size: int,
    present: np.ndarray | None = None,
    stale: np.ndarray | None = None,
) -> Pieces:
    """The buckets of ``size`` steps (``bucket_keys``) of the range ``[first, last]`` as
    pieces, grouped by bucket number: each over its whole aligned interval, clipped to the
    range, so a full bucket is one block when ``size`` is a block size and only the two
    edge buckets are read from finer levels. ``present``: the range's present steps, when
    known (buckets without one are left out); ``stale``: see :meth:`Pieces.add`."""
    pieces = Pieces()
    keys = (
        np.unique(bucket_keys(present, size))
        if present is not None
        else np.arange(first // size, last // size + 1, dtype=np.int64)
    )
    starts = keys * size
    level = _LEVEL_OF.get(size)
    whole = np.zeros(len(keys), dtype=bool)
    if level is not None:  # a bucket inside the range and no stale block in it: its block
        whole = (starts >= first) & (starts + size - 1 <= last)
        if stale is not None and len(stale):
            at = np.searchsorted(stale, starts)
            nearest = stale[np.minimum(at, len(stale) - 1)]
            whole &= ~((at < len(stale)) & (nearest <= starts + size - 1))
        pieces.levels += [level] * int(whole.sum())
        pieces.starts += starts[whole].tolist()
        pieces.block_group += keys[whole].tolist()
    for bucket in keys[~whole].tolist():
        lo, hi = max(bucket * size, first), min(bucket * size + size - 1, last)
        pieces.add(bucket, lo, hi, present, stale)
    return pieces


_LEVEL_OF = {BASE**level: level for level in range(1, LEVELS + 1)}


def whole(
    first: int, last: int, present: np.ndarray | None = None, stale: np.ndarray | None = None
) -> Pieces:
    pieces = Pieces()
    pieces.add(0, first, last, present, stale)
    return pieces


def sparse(first: int, last: int, present: int) -> bool:
    """Whether steps ``[first, last]`` holding ``present`` steps are so sparse that their
    points are fewer than the blocks covering them: read them as points."""
    return (last - first + 1) // BASE**LEVELS > present


def cells(rows: Rows, bucket: np.ndarray) -> dict[str, np.ndarray]:
    """Heatmap cells (``rank, b, v, marks``: a rank's mean finite value in bucket b, NaN if
    none, and its marks there) from sums (``rank, n, marks, total``) each with its bucket:
    block rows of the buckets' covers, points, or both, as a store read them. This is the
    one definition of a cell; every store and read path ends here. Summed with bincount:
    no sort of the ~1M rows a long range reads."""
    rank = np.asarray(rows["rank"], dtype=np.int64)
    bucket = np.asarray(bucket, dtype=np.int64)
    if not len(rank):
        empty = np.empty(0, dtype=np.int64)
        return {"rank": empty, "b": empty, "v": np.empty(0), "marks": empty}
    width = int(bucket.max()) + 1
    cell = rank * width + bucket
    size = (int(rank.max()) + 1) * width

    def summed(name: str) -> np.ndarray:
        return np.bincount(cell, weights=rows[name], minlength=size)

    n = summed("n")
    marks = summed("marks") if rows["marks"].any() else np.zeros(size)  # most runs have none
    seen = np.flatnonzero((n > 0) | (marks > 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        value = summed("total")[seen] / n[seen]
    value[n[seen] == 0] = np.nan
    return {
        "rank": seen // width, "b": seen % width, "v": value, "marks": marks[seen].astype(np.int64)
    }  # fmt: skip


def rollup(rows: Rows) -> list[tuple[object, ...]]:
    """Per rank over the whole range, from the rows of its cover: ``(rank, steps_reported,
    last_step, mean_delta, mean_abs_z, outlier_steps, local_rank, nonfinite_steps)``."""
    _, summed = combine(np.zeros(len(rows["rank"]), dtype=np.int64), rows)
    out: list[tuple[object, ...]] = []
    columns = [summed[name].tolist() for name in FIELDS]
    for rank, n, marks, _total, last, delta, abs_z, outliers, _lr, local in zip(*columns):
        out.append((
            rank, n, last, delta / n if n else None, abs_z / n if n else None, outliers,
            None if local < 0 else local, marks,
        ))  # fmt: skip
    return out
