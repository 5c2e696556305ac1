"""``run.rank_step`` for hand-written loops, and tensors as values (0-dim numpy and torch;
CUDA ones read without a synchronisation of the call's own, where a GPU is present)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

import instantml as im
from instantml.server.process import ServerProcess
from tests.helpers import stored_rank_points


def _values(api: httpx.Client, run_id: str, key: str) -> dict[int, float]:
    return {p[0]: p[2] for p in stored_rank_points(api, run_id, key)}


def test_rank_step_times_a_hand_written_loop(server: ServerProcess, api: httpx.Client) -> None:
    run = im.init(project="loop", upload_mode="sync", base_url=server.url, api_key=server.admin_key)
    for step in range(6):
        time.sleep(0.03)  # the loop waits for its data between steps
        with run.rank_step(step, every=2, rank=1, world_size=4) as s:
            with s.forward():
                time.sleep(0.02)
            time.sleep(0.01)  # backward, optimizer: outside the forward section
            s.log({"train/loss": np.float64(0.5) + step})
    run.finish()
    forward = _values(api, run.run_id, "perf/forward_ms")
    step_time = _values(api, run.run_id, "perf/step_time_ms")
    wait = _values(api, run.run_id, "perf/data_wait_ms")
    assert sorted(forward) == sorted(step_time) == [0, 2, 4]  # every 2 steps
    assert sorted(wait) == [2, 4]  # step 0 has no step before it
    for step in (0, 2, 4):
        assert 20 <= forward[step] < step_time[step]
        assert step_time[step] >= 30
    assert all(w >= 30 for w in wait.values())
    assert _values(api, run.run_id, "train/loss") == {0: 0.5, 2: 2.5, 4: 4.5}
    assert len(stored_rank_points(api, run.run_id, "system/cpu_rss_mb")) == 3
    ranks = {p[1] for p in stored_rank_points(api, run.run_id, "perf/forward_ms")}
    assert ranks == {1}


def test_a_step_that_raises_is_not_logged(server: ServerProcess, api: httpx.Client) -> None:
    run = im.init(project="loop", upload_mode="sync", base_url=server.url, api_key=server.admin_key)
    with pytest.raises(RuntimeError), run.rank_step(0, rank=0, world_size=1):
        raise RuntimeError("out of memory")
    with run.rank_step(1, rank=0, world_size=1):
        pass
    run.finish()
    assert list(_values(api, run.run_id, "perf/step_time_ms")) == [1]


def test_torch_tensors_as_values(server: ServerProcess, api: httpx.Client) -> None:
    torch = pytest.importorskip("torch")
    run = im.init(project="tensors", base_url=server.url, api_key=server.admin_key)
    run.log_rank_metrics(
        {"loss": torch.tensor(1.25), "nan": torch.tensor(float("nan")), "n": torch.tensor(3)},
        step=0, rank=0, world_size=1,
    )  # fmt: skip
    with pytest.raises(TypeError, match="metrics"):
        run.log_rank_metrics({"loss": torch.ones(2)}, step=1, rank=0, world_size=1)
    assert run.finish(timeout=30)
    assert _values(api, run.run_id, "loss") == {0: 1.25}
    assert _values(api, run.run_id, "nan") == {0: "nan"}
    assert _values(api, run.run_id, "n") == {0: 3.0}


def test_cuda_tensors_are_logged_in_order(server: ServerProcess, api: httpx.Client) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none)")
    run = im.init(project="cuda", base_url=server.url, api_key=server.admin_key)
    x = torch.ones(1024, 1024, device="cuda")
    for step in range(20):
        y = (x @ x).mean()  # still being computed when the call returns
        run.log_rank_metrics({"loss": y, "step": float(step)}, step=step, rank=0, world_size=1)
        run.log_rank_metrics({"loss": 7.0}, step=100, rank=0, world_size=1)  # a rewrite, later
    assert run.finish(timeout=60)
    loss = _values(api, run.run_id, "loss")
    assert loss[100] == 7.0 and all(loss[s] == 1024.0 for s in range(20))
