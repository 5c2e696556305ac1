"""Runs under the public instantml 0.1.1 SDK (its own venv): logs one small job in one mode.

Usage: python public_sdk_job.py MODE SPOOL_DIR; prints the run id on the last line.
"""

import sys

import instantml as im

mode, spool_dir = sys.argv[1], sys.argv[2]
run = im.init(
    project="public-sdk",
    name=f"public-{mode}",
    config={"lr": 0.01, "nested": {"depth": 2}},
    tags=["compat"],
    notes="from the public SDK",
    upload_mode=mode,
    spool_dir=spool_dir,
    system_metrics=False,
    async_init=False,
    capture_console=True,
)
for step in range(5):
    print(f"epoch {step} done", flush=True)
    run.log_metrics({"eval/accuracy": 0.5 + step / 10}, step=step)
    for rank in range(4):
        run.log_rank_metrics(
            {"train/loss": 1.0 / (step + 1) + rank, "optimizer/grad_norm": 2.0},
            step=step,
            rank=rank,
            world_size=4,
            local_rank=rank % 2,
            weight=32 * (rank + 1),
        )
print("warning: a slow rank", file=sys.stderr, flush=True)
run.log_config({"batch_size": 128})
run.finish()
if mode == "spool":
    print("drained", im.drain_spool(spool_dir), file=sys.stderr)
print(run.run_id)
