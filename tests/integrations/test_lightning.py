"""Lightning's own DDP launcher, 4 CPU processes on gloo, one rank's forward slower: one
run, every rank's keys, and the slow rank flagged by the stragglers route, nobody else."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from instantml.server.process import ServerProcess
from tests.helpers import stored_rank_points, stored_scalars
from tests.integrations.conftest import HERE, needs, only_run, ranks_of, run_job

SLOW = 2


def test_every_rank_logs_into_one_run_and_the_slow_one_is_flagged(
    server: ServerProcess, api: httpx.Client, tmp_path: Path
) -> None:
    needs("lightning", "torch")
    project = f"lightning-{uuid.uuid4().hex[:6]}"
    run_job([str(HERE / "lightning_job.py"), project, str(SLOW)], server, tmp_path)
    run_id = str(only_run(api, project)["id"])
    run = api.get(f"/runs/{run_id}").json()["run"]  # with the config logged after creation
    assert run["status"] == "finished" and run["world_size"] == 4
    for key in ("train/loss", "perf/step_time_ms", "perf/data_wait_ms", "perf/forward_ms",
                "system/cpu_rss_mb"):  # fmt: skip
        assert ranks_of(api, run_id, key) == {0, 1, 2, 3}, key
    # Each rank's own loss, not the mean: four different series.
    loss = stored_rank_points(api, run_id, "train/loss")
    by_rank = {r: [p[2] for p in loss if p[1] == r] for r in range(4)}
    assert len({tuple(v) for v in by_rank.values()}) == 4
    forward = api.get(f"/api/runs/{run_id}/stragglers", params={"key": "perf/forward_ms"}).json()
    assert forward["stragglers"] == [SLOW], forward
    worst = forward["ranks"][0]
    assert worst["rank"] == SLOW and worst["score"] < 0.5  # 40 ms against ~10 ms
    # Rank 0 also logged the trainer's scalars and the hyperparameters, once.
    assert run["config"]["lr"] == 0.05 and run["config"]["hidden"] == 8
    keys = {k["key"]: k["kind"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]}
    assert keys["train_loss"] == "scalar"
    # The last val_loss is logged when a validation made it, not again at every step after.
    val = stored_scalars(api, run_id, "val_loss")["points"]
    assert [step for step, _ in val] == [10, 26], val  # not at steps 11-25, 27-30
    assert val[0][1] != val[1][1]
