"""Hugging Face's Trainer under torchrun, 2 CPU processes on gloo, a tiny GPT-2 built from
a config: one run (torchrun here sets no job id the ranks share), each rank's own loss."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess, free_port
from tests.helpers import stored_rank_points, stored_scalars
from tests.integrations.conftest import HERE, needs, only_run, ranks_of, run_job


@pytest.mark.parametrize(
    ("average", "accumulate"), [("average", 1), ("per-rank", 1), ("average", 2)]
)
def test_each_rank_logs_its_own_loss_into_one_run(
    server: ServerProcess, api: httpx.Client, tmp_path: Path, average: str, accumulate: int
) -> None:
    """Each rank's own loss on the Trainer's scale: their mean is the Trainer's logged
    ``loss`` (within 10%: the Trainer's averages the steps since its last log), with the
    loss averaged over every rank's tokens (transformers' default) or each rank's, and
    with gradient accumulation."""
    needs("transformers", "torch", "accelerate")
    project = f"hf-{uuid.uuid4().hex[:6]}"
    torchrun = [
        "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
        "--node-rank=0",
    ]  # fmt: skip
    job = [str(HERE / "transformers_job.py"), project, str(tmp_path / "out"), average,
           str(accumulate)]  # fmt: skip
    run_job([*torchrun, *job], server, tmp_path)
    run_id = str(only_run(api, project)["id"])
    run = api.get(f"/runs/{run_id}").json()["run"]  # with the config logged after creation
    assert run["status"] == "finished" and run["world_size"] == 2
    for key in ("train/loss", "perf/step_time_ms", "perf/forward_ms", "system/cpu_rss_mb"):
        assert ranks_of(api, run_id, key) == {0, 1}, key
    points = stored_rank_points(api, run_id, "train/loss")
    steps = sorted({p[0] for p in points})
    assert steps == [2, 4, 6, 8]  # every logging_steps optimizer steps
    by_rank = {r: [p[2] for p in points if p[1] == r] for r in (0, 1)}
    assert by_rank[0] != by_rank[1]  # each rank's own batches, not the Trainer's mean
    keys = {k["key"]: k["kind"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]}
    assert keys.get("loss") == "scalar"  # rank 0's copy of the Trainer's own logs
    trainer = stored_scalars(api, run_id, "loss")["points"]
    assert [int(step) for step, _ in trainer] == steps
    for step, logged in trainer:
        mine = [p[2] for p in points if p[0] == step]
        assert abs(sum(mine) / len(mine) - logged) <= 0.1 * logged, (step, mine, logged)
    assert run["config"]["model/n_embd"] == 16 and run["config"]["logging_steps"] == 2
    assert run["config"]["optim_args"] is None  # None as null, not the text "None"
