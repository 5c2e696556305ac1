"""Accelerate and Keras on real jobs: ``accelerate launch`` with two processes on the CPU,
and a two-process Keras job, each rank logging its own loss into one run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.helpers import stored_rank_points
from tests.integrations.conftest import HERE, needs, only_run, ranks_of


def _env(server: ServerProcess) -> dict[str, str]:
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "INSTANTML_RUN_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return env


def test_accelerate_launch_logs_every_process_into_one_run(
    server: ServerProcess, api: httpx.Client, tmp_path: Path
) -> None:
    needs("accelerate", "torch")
    launcher = Path(sys.executable).with_name("accelerate")
    out = subprocess.run(
        [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", str(HERE / "accelerate_job.py")],
        cwd=tmp_path, env=_env(server), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    run = only_run(api, "accelerate-job")  # one run for the job, not one per process
    run_id = str(run["id"])
    assert run["world_size"] == 2
    for key in ("train/loss", "perf/step_time_ms", "perf/forward_ms"):
        assert ranks_of(api, run_id, key) == {0, 1}, key
    loss = stored_rank_points(api, run_id, "train/loss")
    assert sorted({p[0] for p in loss}) == list(range(1, 13))
    by_rank = {r: [p[2] for p in loss if p[1] == r] for r in (0, 1)}
    assert by_rank[0] != by_rank[1]  # each process's own loss
    keys = {k["key"]: k["kind"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]}
    assert keys["lr"] == "scalar" and keys["train/loss_rank0"] == "scalar"  # the tracker's
    assert api.get(f"/runs/{run_id}").json()["run"]["config"]["lr"] == 0.05


def test_a_keras_job_logs_every_rank_into_one_run(
    server: ServerProcess, api: httpx.Client, tmp_path: Path
) -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")  # Keras' default backend is TensorFlow
    needs("keras", "torch")
    run_id = f"keras-{uuid.uuid4().hex[:8]}"
    procs = []
    for rank in range(2):
        env = {**_env(server), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "INSTANTML_RUN_ID": run_id, "KERAS_BACKEND": "torch"}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "keras_job.py")], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-6000:]
    run = api.get(f"/runs/{run_id}").json()["run"]
    assert run["status"] == "finished" and run["world_size"] == 2
    assert ranks_of(api, run_id, "train/loss") == {0, 1}
    assert ranks_of(api, run_id, "perf/step_time_ms") == {0, 1}
    loss = stored_rank_points(api, run_id, "train/loss")
    # 192 training samples / 32 = 6 batches an epoch, 2 epochs: steps 2, 4, ..., 12.
    assert sorted({p[0] for p in loss}) == [2, 4, 6, 8, 10, 12]
    by_rank = {r: [p[2] for p in loss if p[1] == r] for r in (0, 1)}
    assert by_rank[0] != by_rank[1]
    # Rank 0's epoch metrics as scalars, the optimizer's settings as config.
    keys = {k["key"]: k["kind"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]}
    assert keys["val_loss"] == "scalar" and keys["epoch"] == "scalar"
    assert run["config"]["optimizer/learning_rate"] == pytest.approx(0.05)
    # The batches' own losses (from Keras' running means): positive, rank 1's noisier shard
    # higher once the model has fitted.
    assert all(v > 0 for v in by_rank[0] + by_rank[1])
    assert by_rank[1][-1] > by_rank[0][-1]
