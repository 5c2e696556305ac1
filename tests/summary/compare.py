"""Comparing a server summary with the reference: numbers to a relative 1e-9."""

from __future__ import annotations

import math
from typing import Any

REL = 1e-9


def close(a: Any, b: Any, atol: float, path: str = "") -> None:
    if isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() >= b.keys(), (path, a, b)
        for k in b:
            close(a[k], b[k], atol, f"{path}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, atol, f"{path}[{i}]")
    elif isinstance(b, float) or isinstance(a, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), (path, a, b)
        assert math.isfinite(a), (path, a)
        assert math.isclose(a, b, rel_tol=REL, abs_tol=atol), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _borderline(o: dict[str, Any], z: float) -> bool:
    # |z| or |robust_z| within rounding of a threshold: two correct implementations may
    # round to either side (with 2 ranks, |z| is exactly 1 in exact arithmetic).
    return abs(abs(o["z"]) - z) < 1e-9 or abs(abs(o["robust_z"]) - 3.5) < 1e-9


def assert_matches(
    server: dict[str, Any], ref: dict[str, Any], scale: float, z: float = 3.0
) -> None:
    """Everything equal; ``ranks`` and ``outliers`` compared by (step,) rank, since their
    order ties on floats that two correct implementations may round apart."""
    atol = 1e-12 * max(scale, 1e-300)
    for field in (
        "world_size",
        "step_range",
        "bucket_size",
        "steps",
        "coverage",
        "heatmap",
        "first_nonfinite",
    ):
        close(server[field], ref[field], atol, field)
    borderline: dict[int, int] = {}
    for o in ref["all_scores"]:
        if _borderline(o, z):
            borderline[o["rank"]] = borderline.get(o["rank"], 0) + 1
    assert abs(server["outliers_total"] - ref["outliers_total"]) <= sum(borderline.values())
    got_ranks = {r["rank"]: dict(r) for r in server["ranks"]}
    want_ranks = {r["rank"]: dict(r) for r in ref["ranks"]}
    for rank, row in want_ranks.items():
        assert abs(
            got_ranks[rank].pop("outlier_steps") - row.pop("outlier_steps")
        ) <= borderline.get(rank, 0)
    for rank, row in want_ranks.items():  # in the values' units: an ulp of 1e9 is 1e-7
        close(got_ranks[rank].pop("mean_delta"), row.pop("mean_delta"), atol, f"ranks.{rank}")
    close(got_ranks, want_ranks, 1e-9, "ranks")
    order = [(r["mean_abs_z"], abs(r["mean_delta"])) for r in server["ranks"]]
    assert all(order[i][0] >= order[i + 1][0] - 1e-9 for i in range(len(order) - 1)), order
    key = lambda o: (o["step"], o["rank"])  # noqa: E731
    got = {key(o): o for o in server["outliers"] if not _borderline(o, z)}
    want = {key(o): o for o in ref["outliers"] if not _borderline(o, z)}
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    for k in want:
        close(
            got[k],
            {f: v for f, v in want[k].items() if f not in ("z", "robust_z")},
            atol,
            f"outliers{k}",
        )
        close(got[k]["z"], want[k]["z"], 1e-9, f"outliers{k}.z")
        close(got[k]["robust_z"], want[k]["robust_z"], 1e-9, f"outliers{k}.robust_z")
    scores = [abs(o["robust_z"]) for o in server["outliers"]]
    assert all(scores[i] >= scores[i + 1] - 1e-9 for i in range(len(scores) - 1))
