"""A series' points out of the server: JSON, CSV, Parquet and Arrow round-trip what was
logged (non-finite values included), a step range bounds them, a long series streams in
windows, and bad input is refused naming the field."""

from __future__ import annotations

import io
import math
from typing import Any

import httpx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import rank_body

FORMATS = ("json", "csv", "parquet", "arrow")
RANK_COLUMNS = ["step", "rank", "local_rank", "node", "value", "weight", "world_size"]
MARKS = {(3, 2): math.nan, (4, 2): math.inf, (5, 2): -math.inf}


def _event(run_id: str, i: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "event_id": f"{run_id}-{i}",
        "request": {"method": "POST", "path": path, "body": body},
    }


def _log(api: httpx.Client, run_id: str, bodies: list[tuple[str, dict[str, Any]]]) -> None:
    for start in range(0, len(bodies), 5000):
        events = [
            _event(run_id, start + i, path, body)
            for i, (path, body) in enumerate(bodies[start : start + 5000])
        ]
        response = api.post("/api/ingest", json={"events": events})
        assert response.status_code == 200, response.text
        assert all(r["status"] < 300 for r in response.json()["results"]), response.text


def _expected_rank_points() -> pd.DataFrame:
    rows = []
    for step in range(6):
        for rank in range(4):
            value = MARKS.get((step, rank), step + rank / 10)
            local = None if rank == 3 else rank % 2
            rows.append((step, rank, local, None, value, float(1 + rank), 4))
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


@pytest.fixture
def logged(api: httpx.Client, run_id: str) -> str:
    bodies = []
    for step in range(6):
        for rank in range(4):
            extra: dict[str, Any] = {"weight": float(1 + rank), "world_size": 4}
            extra["local_rank"] = None if rank == 3 else rank % 2
            if (step, rank) in MARKS:
                mark = {math.inf: "inf", -math.inf: "-inf"}.get(MARKS[(step, rank)], "nan")
                body = rank_body(
                    step=step, rank=rank, metrics={}, nonfinite={"loss": mark}, **extra
                )
            else:
                body = rank_body(step=step, rank=rank, metrics={"loss": step + rank / 10}, **extra)
            bodies.append((f"/runs/{run_id}/rank-metrics", body))
    for step, value in ((0.5, 1.5), (2, None), (7, 1.0)):
        body = {"metrics": {"eval/loss": value}, "step": step} if value is not None else {
            "metrics": {}, "nonfinite": {"eval/loss": "nan"}, "step": step}  # fmt: skip
        bodies.append((f"/runs/{run_id}/metrics", body))
    _log(api, run_id, bodies)
    return run_id


def _read(response: httpx.Response, fmt: str) -> pd.DataFrame:
    assert response.status_code == 200, response.text
    if fmt == "json":
        body = response.json()
        frame = pd.DataFrame(body["points"], columns=body["columns"])
        marks = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
        frame["value"] = [marks.get(v, v) if isinstance(v, str) else v for v in frame["value"]]
        return frame.astype({"value": float})
    if fmt == "csv":
        assert response.headers["content-type"].startswith("text/csv")
        return pd.read_csv(io.BytesIO(response.content))
    if fmt == "parquet":
        return pq.read_table(io.BytesIO(response.content)).to_pandas()
    assert response.headers["content-type"] == "application/vnd.apache.arrow.stream"
    return pa.ipc.open_stream(response.content).read_all().to_pandas()


def _same(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected), (got, expected)
    for name in expected.columns:
        a = got[name].tolist()
        b = expected[name].tolist()
        for x, y in zip(a, b, strict=True):
            if y is None or (isinstance(y, float) and math.isnan(y) and name != "value"):
                assert x is None or (isinstance(x, float) and math.isnan(x)), (name, a, b)
            elif isinstance(y, float) and math.isnan(y):
                assert isinstance(x, float) and math.isnan(x), (name, a, b)
            else:
                assert x == y, (name, a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rank_points_round_trip_in_every_format(api: httpx.Client, logged: str, fmt: str) -> None:
    response = api.get(f"/api/runs/{logged}/rank-points", params={"key": "loss", "format": fmt})
    _same(_read(response, fmt), _expected_rank_points())
    if fmt != "json":
        assert "attachment" in response.headers["content-disposition"]
    ranged = api.get(
        f"/api/runs/{logged}/rank-points",
        params={"key": "loss", "format": fmt, "step_min": 2, "step_max": 4},
    )
    expected = _expected_rank_points()
    _same(
        _read(ranged, fmt),
        expected[(expected.step >= 2) & (expected.step <= 4)].reset_index(drop=True),
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_scalars_round_trip_in_every_format(api: httpx.Client, logged: str, fmt: str) -> None:
    response = api.get(f"/api/runs/{logged}/metrics", params={"key": "eval/loss", "format": fmt})
    got = _read(response, fmt)
    assert list(got.columns) == ["step", "value", "timestamp"]
    assert got["step"].tolist() == [0.5, 2, 7]
    values = got["value"].tolist()
    assert values[0] == 1.5 and math.isnan(values[1]) and values[2] == 1.0
    assert all(t > 1e9 for t in got["timestamp"])  # when it was logged (unix seconds)
    ranged = api.get(
        f"/api/runs/{logged}/metrics",
        params={"key": "eval/loss", "format": fmt, "step_min": 1, "step_max": 7},
    )
    assert _read(ranged, fmt)["step"].tolist() == [2, 7]


def test_json_gives_marks_as_strings(api: httpx.Client, logged: str) -> None:
    body = api.get(f"/api/runs/{logged}/rank-points", params={"key": "loss"}).json()
    assert body["columns"] == RANK_COLUMNS and body["key"] == "loss"
    value = body["columns"].index("value")
    marks = {(p[0], p[1]): p[value] for p in body["points"] if isinstance(p[value], str)}
    assert marks == {(3, 2): "nan", (4, 2): "inf", (5, 2): "-inf"}
    scalar = api.get(f"/api/runs/{logged}/metrics", params={"key": "eval/loss"}).json()
    assert [p[:2] for p in scalar["points"]] == [[0.5, 1.5], [2, "nan"], [7, 1.0]]


def test_a_long_series_streams_whole_and_in_order(api: httpx.Client, run_id: str) -> None:
    # More points than one window of the store's reads (storage/export.py): several windows.
    steps, ranks = 700, 512
    bodies = [
        (f"/runs/{run_id}/rank-metrics",
         rank_body(step=s, rank=r, world_size=ranks, local_rank=r % 8, metrics={"k": s * 1000 + r}))
        for s in range(steps) for r in range(ranks)
    ]  # fmt: skip
    _log(api, run_id, bodies)
    for fmt in ("parquet", "csv", "arrow"):
        got = _read(
            api.get(f"/api/runs/{run_id}/rank-points", params={"key": "k", "format": fmt}), fmt
        )
        assert len(got) == steps * ranks
        assert got["value"].tolist() == [
            float(s * 1000 + r) for s in range(steps) for r in range(ranks)
        ]
        assert got["local_rank"].tolist() == [r % 8 for _ in range(steps) for r in range(ranks)]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"key": "loss", "format": "xml"}, "format"),
        ({"key": "loss", "step_min": 5, "step_max": 2}, "step_min"),
        ({"key": "loss", "step_min": -1}, "step_min"),
        ({"format": "csv"}, "key"),
    ],
)
def test_bad_export_requests_name_the_field(
    api: httpx.Client, logged: str, params: dict[str, Any], field: str
) -> None:
    response = api.get(f"/api/runs/{logged}/rank-points", params=params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith(f"{field}:"), error
    if field == "format":
        assert all(name in error for name in FORMATS), error


def test_an_unknown_run_or_key_is_404(api: httpx.Client, logged: str) -> None:
    for path, key in (("/api/runs/nope/rank-points", "loss"), (f"/api/runs/{logged}/rank-points", "nope"),
                      (f"/api/runs/{logged}/metrics", "nope")):  # fmt: skip
        for fmt in FORMATS:
            assert api.get(path, params={"key": key, "format": fmt}).status_code == 404
