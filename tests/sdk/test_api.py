"""``from instantml import Api``: runs, points as pandas and pyarrow, summaries and deletes
from a real server; ``instantml export`` to files; and the light import."""

from __future__ import annotations

import math
import os
import pty
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pyarrow.parquet as pq
import pytest

from instantml import Api, InstantMLError
from instantml.server.process import ServerProcess
from tests.helpers import instantml, rank_body


@pytest.fixture
def logged(api: httpx.Client, run_id: str) -> str:
    events = []
    for step in range(5):
        for rank in range(3):
            body = rank_body(step=step, rank=rank, world_size=3, local_rank=rank,
                             metrics={"loss": step + rank / 10})  # fmt: skip
            if (step, rank) == (2, 1):
                body = rank_body(step=step, rank=rank, world_size=3, local_rank=rank,
                                 metrics={}, nonfinite={"loss": "nan"})  # fmt: skip
            path = f"/runs/{run_id}/rank-metrics"
            events.append({"event_id": f"{run_id}-{step}-{rank}",
                           "request": {"method": "POST", "path": path, "body": body}})  # fmt: skip
    assert api.post("/api/ingest", json={"events": events}).status_code == 200
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/acc": 0.75}, "step": 4})
    return run_id


def test_points_come_out_as_dataframes_and_tables(server: ServerProcess, logged: str) -> None:
    with Api(server.url, server.admin_key) as client:
        frame = client.rank_points(logged, "loss")
        assert list(frame.columns) == ["step", "rank", "local_rank", "node", "value", "weight",
                                       "world_size"]  # fmt: skip
        assert len(frame) == 15 and frame["step"].is_monotonic_increasing
        nan = frame[(frame.step == 2) & (frame["rank"] == 1)]["value"].iloc[0]
        assert math.isnan(nan)
        ok = frame.dropna(subset=["value"])
        assert (ok["value"] == ok["step"] + ok["rank"] / 10).all()
        table = client.rank_table(logged, "loss", step_min=3)
        assert table.column("step").to_pylist() == [3, 3, 3, 4, 4, 4]
        scalars = client.scalars(logged, "eval/acc")
        assert scalars[["step", "value"]].values.tolist() == [[4.0, 0.75]]
        runs = {r["id"]: r for r in client.runs(project="tests")}
        assert runs[logged]["points"] == 16
        summary = client.summary(logged, "loss")
        assert summary["key"] == "loss" and summary["first_nonfinite"]["step"] == 2
        with pytest.raises(InstantMLError, match="404"):
            client.rank_points(logged, "nope")


def test_delete_through_the_api(server: ServerProcess, logged: str) -> None:
    with Api(server.url, server.admin_key) as client:
        client.delete_run(logged)
        with pytest.raises(InstantMLError, match="404"):
            client.run(logged)
        with pytest.raises(InstantMLError, match="404"):
            client.delete_run(logged)


def test_api_finds_the_server_as_init_does(server: ServerProcess, logged: str) -> None:
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    code = f"from instantml import Api; print(len(Api().rank_points({logged!r}, 'loss')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "15", out.stderr


def test_without_the_analysis_extra_the_error_says_what_to_install(
    server: ServerProcess, logged: str
) -> None:
    code = (
        "import sys; sys.modules['pandas'] = None; sys.modules['pyarrow'] = None\n"
        "from instantml import Api\n"
        f"Api({server.url!r}, {server.admin_key!r}).rank_points({logged!r}, 'loss')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "pip install 'instantml[analysis]'" in out.stderr


def test_import_instantml_stays_light() -> None:
    code = "import sys, instantml; print(sorted({'pandas', 'pyarrow', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_export_writes_each_format(server: ServerProcess, logged: str, tmp_path: Path) -> None:
    env = {"INSTANTML_API_BASE_URL": server.url, "INSTANTML_API_KEY": server.admin_key}
    target = tmp_path / "loss.csv"
    out = instantml(
        "export", logged, "--key", "loss", "--format", "csv", "-o", str(target), env=env
    )
    assert out.returncode == 0, out.stderr
    assert "15 points" in out.stdout
    frame = pd.read_csv(target)
    assert len(frame) == 15 and frame["value"].isna().sum() == 1
    out = subprocess.run(
        [sys.executable, "-m", "instantml", "export", logged, "--key", "loss", "--step-min", "4"],
        env={**os.environ, **env}, cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (written,) = tmp_path.glob("*.parquet")
    assert pq.read_table(written).column("step").to_pylist() == [4, 4, 4]
    missing = instantml("export", logged, "--key", "nope", env=env)
    assert (
        missing.returncode != 0 and "no key 'nope'" in missing.stderr and "loss" in missing.stderr
    )


def test_export_shows_progress_on_a_terminal(
    server: ServerProcess, logged: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    env["COLUMNS"] = "100"
    main, side = pty.openpty()
    target = tmp_path / "loss.arrow"
    proc = subprocess.Popen(
        [sys.executable, "-m", "instantml", "export", logged, "--key", "loss", "--format",
         "arrow", "-o", str(target)],
        env=env, stdin=side, stdout=side, stderr=side,
    )  # fmt: skip
    os.close(side)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0, seen
    os.close(main)
    assert b"15 points" in seen and target.stat().st_size > 0
    assert b"\x1b[" in seen  # the progress bar drew (and cleared) itself on the terminal
