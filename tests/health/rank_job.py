"""One rank of a real multi-process job, as a user writes it: ``init`` from the launcher's
environment (RANK, WORLD_SIZE, INSTANTML_RUN_ID, the server's address and key), a
hand-written loop timed with ``run.rank_step``, a loss with per-batch noise, ``finish``.

    python tests/health/rank_job.py --steps 150 [--mode async|spool --spool-dir D]
        [--delay S] [--slow X] [--nan-from STEP] [--exit-at STEP --exit-file F]

``--slow X`` makes this rank's forward X times as long; ``--nan-from`` logs a NaN loss
from that step on; ``--exit-at`` ends the process with ``os._exit`` at the start of that
step (no finish, no flush), writing the time it did so to ``--exit-file`` first."""

from __future__ import annotations

import argparse
import math
import os
import random
import time

import instantml as im


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--mode", default="async")
    parser.add_argument("--spool-dir")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--step-ms", type=float, nargs=2, default=(20.0, 60.0))
    parser.add_argument("--slow", type=float, default=1.0)
    parser.add_argument("--nan-from", type=int)
    parser.add_argument("--exit-at", type=int)
    parser.add_argument("--exit-file")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rng = random.Random(1000 + rank)
    time.sleep(args.delay)  # ranks start seconds apart, as launchers start them
    spool = {"spool_dir": args.spool_dir, "spool_uploader": True} if args.spool_dir else {}
    run = im.init(project="health-jobs", upload_mode=args.mode, **spool)  # type: ignore[arg-type]
    low, high = args.step_ms
    for step in range(args.steps):
        if step == args.exit_at:
            if args.exit_file:
                with open(args.exit_file, "w") as out:
                    out.write(str(time.time()))
            os._exit(1)
        with run.rank_step(step, system=False) as s:
            with s.forward():
                time.sleep(rng.uniform(low, high) / 1000 * 0.7 * args.slow)
            time.sleep(rng.uniform(low, high) / 1000 * 0.3)
            loss = 2.0 * math.exp(-step / 300) * (1 + 0.05 * rng.gauss(0, 1))
            if args.nan_from is not None and step >= args.nan_from:
                loss = float("nan")
            s.log({"train/loss": loss})
    run.finish()


if __name__ == "__main__":
    main()
