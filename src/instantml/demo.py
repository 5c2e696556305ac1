"""``instantml demo``: a real multi-process job against a real server.

Eight rank processes (spool mode by default: they only append to local files, and the
uploader that the first ``init`` starts delivers them) each fit a small linear model by SGD on their own data shard and log
``train/loss``, ``optimizer/grad_norm`` and ``perf/step_time_ms`` per rank, with their batch
size as weight. Rank 5 has a noisier shard and a slower step; rank 3 dies after 60% of the
steps; rank 7 uses a 4x larger batch, so weighted and plain means part.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import uuid
from pathlib import Path

SLOW_RANK, DEAD_RANK, BIG_BATCH_RANK = 5, 3, 7


def worker(
    rank: int, world_size: int, steps: int, env: dict[str, str], upload_mode: str, spool_dir: str
) -> None:
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % 4))
    import instantml as im

    run = im.init(
        project="demo",
        name="distributed-demo",
        upload_mode=upload_mode,
        config={"world_size": world_size, "lr": 0.05, "steps": steps},
        spool_dir=spool_dir,
        spool_uploader=True,
    )
    rng = random.Random(1000 + rank)
    noise = 1.5 if rank == SLOW_RANK else 0.3
    batch = 256 if rank == BIG_BATCH_RANK else 64
    w, b = 0.0, 0.0
    for step in range(steps):
        started = time.perf_counter()
        xs = [rng.uniform(-1, 1) for _ in range(batch)]
        ys = [3.0 * x + 2.0 + rng.gauss(0, noise) for x in xs]
        errs = [w * x + b - y for x, y in zip(xs, ys)]
        loss = sum(e * e for e in errs) / batch
        gw = 2 * sum(e * x for e, x in zip(errs, xs)) / batch
        gb = 2 * sum(errs) / batch
        w, b = w - 0.05 * gw, b - 0.05 * gb
        time.sleep(0.004 + (0.006 + rng.random() * 0.01 if rank == SLOW_RANK else 0.0))
        step_ms = (time.perf_counter() - started) * 1000
        run.log_rank_metrics(
            {
                "train/loss": loss,
                "optimizer/grad_norm": math.hypot(gw, gb),
                "perf/step_time_ms": step_ms,
            },
            step=step,
            weight=batch,
        )
        if rank == 0 and step % 10 == 0:
            run.log({"eval/w_error": abs(w - 3.0)}, step=step)
        if rank == DEAD_RANK and step == int(steps * 0.6):
            run.flush(10)
            os._exit(1)  # dies without finishing, as a crashed worker would
    run.finish()


def _wait_for_spool(spool_dir: Path, timeout: float) -> bool:
    """Wait for the background uploader to deliver every segment of the spool."""
    from .spool import segments

    deadline = time.monotonic() + timeout
    while segments.list_segments(spool_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _cli() -> str:
    """The CLI as a user can type it: the venv's own ``instantml`` script when there is
    one (the README's setup puts it in ``.venv/bin``), else this interpreter's module."""
    script = Path(sys.executable).parent / "instantml"
    return str(script) if script.exists() else f"{sys.executable} -m instantml"


def _stop_on_sigterm() -> None:
    """SIGTERM ends the demo like Ctrl-C: the ``finally`` blocks stop the ranks and the
    server, instead of leaving them running without their parent."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(
    data_dir: Path, port: int, world_size: int, steps: int, upload_mode: str, serve: bool
) -> int:
    from .server.process import ServerProcess, StartFailed

    _stop_on_sigterm()
    data_dir = data_dir.resolve()
    # The demo's server keeps its own credentials (its admin key file, passed to the ranks
    # in the environment): it never writes the user's ~/.instantml/credentials.
    server = ServerProcess(
        data_dir,
        port=port,
        log_path=data_dir.parent / "demo-server.log",
        env={"INSTANTML_WRITE_CREDENTIALS": "0"},
    )
    print(f"Starting the server on {server.url} (data: {data_dir}) ...", flush=True)
    procs: list[mp.process.BaseProcess] = []
    try:
        try:
            server.start()
        except StartFailed as exc:
            print(f"error: the demo server did not start: {exc.reason}", file=sys.stderr)
            return 1
        run_id = f"demo-{uuid.uuid4().hex[:8]}"
        env = {
            "INSTANTML_RUN_ID": run_id,
            "INSTANTML_API_KEY": server.admin_key,
            "INSTANTML_API_BASE_URL": server.url,
        }
        print(
            f"Running {world_size} rank processes for {steps} steps (run {run_id}) ...", flush=True
        )
        started = time.perf_counter()
        spool_dir = data_dir.parent / "spool"
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=worker, args=(r, world_size, steps, env, upload_mode, str(spool_dir))
            )
            for r in range(world_size)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        codes = {r: p.exitcode for r, p in enumerate(procs)}
        if upload_mode == "spool" and not _wait_for_spool(spool_dir, timeout=120):
            print(f"error: the spool in {spool_dir} was not drained; see {spool_dir}/uploader.log")
            return 1
        print(
            f"Job done in {time.perf_counter() - started:.1f}s; exit codes {codes}"
            f" (rank {DEAD_RANK} dies on purpose)"
        )
        bad = [r for r, c in codes.items() if c != 0 and r != DEAD_RANK]
        if bad:
            print(f"error: ranks {bad} failed; server log: {server.log()}")
            return 1
        cli = _cli()
        key = f"$(cat {data_dir / 'admin-key'})"
        ranks = f"INSTANTML_API_BASE_URL={server.url} INSTANTML_API_KEY={key} {cli} ranks {run_id}"
        print(f"Run id: {run_id}")
        if serve:
            print(f"Dashboard: {server.url}/?token={server.admin_key}#/runs/{run_id}")
            print(f"Summary:   {ranks}")
            print("Serving; press Ctrl-C to stop.", flush=True)
            try:
                while server.proc is not None and server.proc.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
        else:
            print("The server is stopped (--no-serve). To look at the run later, start it:")
            print(f"  {cli} server --data-dir {data_dir} --port {port} --no-credentials")
            print(f"then open {server.url}/?token={server.admin_key}#/runs/{run_id}, or run:")
            print(f"  {ranks}")
        return 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        server.stop()
