"""The uploader keeps two batches in flight, and a segment's events still land in order:
its run is created before its points, a point's later write wins over its earlier one,
and the run is finished after its last point."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

import instantml as im
from instantml.server.process import ServerProcess
from instantml.spool.uploader import Uploader
from tests.helpers import stored_rank_points


def test_pipelined_batches_keep_each_segment_in_order(
    tmp_path: Path, server: ServerProcess, api: httpx.Client
) -> None:
    spool, run_id = tmp_path / "spool", f"pipe-{uuid.uuid4().hex[:8]}"
    runs = [
        im.init(project="spool", run_id=run_id, upload_mode="spool", spool_dir=spool)
        for _ in range(2)  # two "rank processes": two segments
    ]
    for rank, run in enumerate(runs):
        for step in range(30):
            run.log_rank_metrics({"loss": float(step)}, step=step, rank=rank, world_size=2)
        for step in range(10):  # rewrites, later in the same segment
            run.log_rank_metrics({"loss": 100.0 + step}, step=step, rank=rank, world_size=2)
        run.finish()
    with Uploader(spool, server.url, server.admin_key, batch_events=4, pipeline=2) as uploader:
        stats = uploader.run()
    assert (stats.delivered, stats.replayed, stats.dead_lettered) == (2 * (1 + 30 + 10 + 1), 0, 0)
    points = stored_rank_points(api, run_id, "loss")
    values = {(step, rank): value for step, rank, value, *_ in points}
    assert len(points) == len(values) == 60
    for rank in range(2):
        assert [values[(s, rank)] for s in range(30)] == [100.0 + s for s in range(10)] + [
            float(s) for s in range(10, 30)
        ]
    assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "finished"
    assert not list((spool / "segments").glob("*.jsonl"))
