"""The Distributed summary's answer, assembled from the rows a point store read
(``rankmath.rows.SummaryRows``): buckets, coverage and missing ranks, the heatmap's
layout, the outlier rows and the per-rank rollup, as docs/reference.md defines them. Backend
neutral: every point store returns the same rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..validation import mark_of
from .coverage import missing_ranks

if TYPE_CHECKING:
    from ..rankmath.rows import SummaryRows

_INT_FIELDS = ("step", "step_end", "count", "expected", "nonfinite", "nonfinite_total")
_FLOAT_FIELDS = (
    "mean", "weighted_mean", "min", "max", "range", "std", "p05", "p50", "p95"
)  # fmt: skip


def assemble(rows: SummaryRows) -> dict[str, Any]:
    """Everything of the answer but ``run_id``, ``key`` and ``keys``."""
    if rows.span is None:
        return empty(rows.world_size)
    first, last = rows.span
    last_step_of_rank = {int(r[0]): int(r[2]) for r in rows.rollup}
    ranks = _rollup(rows.rollup, rows.nonfinite_firsts)
    return {
        "world_size": rows.world_size,
        "step_range": [first, last],
        "bucket_size": rows.band_size,
        "steps": _steps(rows.band),
        "coverage": {
            "full_steps": rows.full_steps,
            "partial_steps": rows.partial_steps,
            # Against the world size reported at the last step, not the key's largest: a
            # stray call with a larger world_size, or an elastic job that shrank, lists no
            # phantom ranks.
            "missing": missing_ranks(
                rows.last_expected, first, last, last_step_of_rank, rows.next_step
            ),
            "lagging": [],  # live runs: the server's reading, by when it heard from ranks
        },
        "heatmap": _heatmap(rows),
        "outliers": [
            {
                "step": step,
                "rank": rank,
                "local_rank": local_rank,
                "value": value,
                "mean": mean,
                "delta": delta,
                "z": z,
                "robust_z": robust_z,
            }
            for step, rank, local_rank, value, mean, delta, z, robust_z in rows.outliers
        ],
        # Every outlier row of the range: the rollup counts them per rank by the same test.
        "outliers_total": sum(r["outlier_steps"] for r in ranks),
        "ranks": ranks,
        "first_nonfinite": None
        if rows.first_nonfinite is None
        else {
            "step": rows.first_nonfinite[0],
            "rank": rows.first_nonfinite[1],
            "value": mark_of(rows.first_nonfinite[2]),
        },
    }


def empty(world_size: int) -> dict[str, Any]:
    return {
        "world_size": int(world_size),
        "step_range": None,
        "bucket_size": 1,
        "steps": [],
        "coverage": {"full_steps": 0, "partial_steps": 0, "missing": [], "lagging": []},
        "heatmap": {"ranks": [], "bucket_size": 1, "buckets": [], "values": [], "nonfinite": []},
        "outliers": [],
        "outliers_total": 0,
        "ranks": [],
        "nodes": [],
        "first_nonfinite": None,
    }


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if v != v else float(v) for v in values.tolist()]


def _steps(band: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The band's entries (``rankmath.step_blocks.entries``: a bucket's means of its steps'
    reducers, min of mins, max of maxes, ``count`` and ``nonfinite`` of its least-covered
    step, marks summed as ``nonfinite_total``, max expected; one step each when the
    bucket size is 1) as JSON rows."""
    columns = dict(band)
    columns["range"] = columns["max"] - columns["min"]
    ints = {name: columns[name].tolist() for name in _INT_FIELDS}
    floats = {name: _floats(columns[name]) for name in _FLOAT_FIELDS}
    return [
        {
            **{name: ints[name][i] for name in _INT_FIELDS[:4]},
            **{name: floats[name][i] for name in _FLOAT_FIELDS},
            "nonfinite": ints["nonfinite"][i],
            "nonfinite_total": ints["nonfinite_total"][i],
        }
        for i in range(len(ints["step"]))
    ]


def _rollup(
    rows: list[tuple[Any, ...]], firsts: dict[int, tuple[int, float]]
) -> list[dict[str, Any]]:
    """Per rank, noisiest first: by mean |z|, then |mean delta|, then rank number."""
    ranked = sorted(rows, key=lambda r: (-(r[4] or 0.0), -abs(r[3] or 0.0), r[0]))
    return [
        {
            "rank": rank,
            "local_rank": local_rank,
            "steps_reported": reported,
            "last_step": last,
            "mean_delta": mean_delta or 0.0,
            "mean_abs_z": mean_abs_z or 0.0,
            "outlier_steps": outliers,
            "nonfinite_steps": nonfinite,
            "first_nonfinite_step": firsts[rank][0] if rank in firsts else None,
        }
        for rank, reported, last, mean_delta, mean_abs_z, outliers, local_rank, nonfinite in ranked
    ]


def _heatmap(rows: SummaryRows) -> dict[str, Any]:
    """``values[i][j]``: rank ``ranks[i]``'s mean finite value in bucket j (None if none);
    ``nonfinite``: the ``[i, j]`` cells where that rank sent a NaN or +-inf. ``values`` is
    a numpy grid, NaN where a cell is empty: the JSON renderer writes it as lists, NaN as
    null, without a Python object per cell."""
    cells = rows.cells
    ranks = np.unique(cells["rank"])
    at = np.searchsorted(ranks, cells["rank"])
    cols = np.searchsorted(rows.heat_keys, cells["b"])
    grid = np.full((len(ranks), len(rows.heat_keys)), np.nan)
    grid[at, cols] = cells["v"]
    marked = np.flatnonzero(cells["marks"] > 0)
    return {
        "ranks": ranks.tolist(),
        "bucket_size": rows.heat_size,
        "buckets": rows.heat_spans.tolist(),
        "values": grid,
        "nonfinite": [list(c) for c in sorted(zip(at[marked].tolist(), cols[marked].tolist()))],
    }
