"""Training-side cost of the per-rank integrations, on the CPU.

    .venv/bin/python bench/bench_integrations.py [--steps 2000] [--trials 5]

1. The Lightning callback and the Hugging Face callback: the time spent inside their hooks
   per optimizer step (measured around each hook, so the framework's own time, which
   varies from step to step far more than the callback costs, does not blur it), logging
   every step (the worst case) and every 50 steps; spool mode (local files only).
2. ``run.rank_step``: the context manager with a forward section and a value, per step,
   against the same loop without it (interleaved blocks of steps), and timed around it.
Medians over trials. (A GPU step's share needs a GPU machine: not measured here.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import instantml as im

HOOKS_LIGHTNING = ("on_train_batch_start", "on_before_backward", "on_train_batch_end")
HOOKS_HF = ("on_step_begin", "on_step_end", "_forward_start", "_forward_end")


def instrumented(callback: Any, hooks: tuple[str, ...]) -> list[int]:
    """Wrap the callback's hooks to add up their time (ns); returns the running total."""
    total = [0]
    for name in hooks:
        original = getattr(callback, name)

        def timed(*args: Any, _f: Any = original, **kw: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return _f(*args, **kw)
            finally:
                total[0] += time.perf_counter_ns() - start

        setattr(callback, name, timed)
    return total


def lightning_cost(steps: int, every: int, spool: str) -> float:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from instantml.integrations.lightning import InstantMLCallback

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = InstantMLCallback(
        project="bench", log_every_n_steps=every, upload_mode="spool", spool_dir=spool
    )
    total = instrumented(callback, HOOKS_LIGHTNING)
    data = TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, log_every_n_steps=every,
        enable_checkpointing=False, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Model(), DataLoader(data, batch_size=4))
    return total[0] / steps / 1000


def hf_cost(steps: int, every: int, spool: str, out: str) -> float:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from instantml.integrations.transformers import InstantMLCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return steps * 2

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.full((8,), i % 64)
            return {"input_ids": ids, "labels": ids}

    callback = InstantMLCallback(
        project="bench", logging_steps=every, upload_mode="spool", spool_dir=spool
    )
    total = instrumented(callback, HOOKS_HF)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    )
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, max_steps=steps, logging_steps=every,
        use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train()
    return total[0] / steps / 1000


def rank_step_cost(steps: int, spool: str) -> tuple[float, float]:
    """(per-step difference with and without rank_step, interleaved blocks; the time spent
    entering it, in ``s.log`` and leaving it, where it logs), in µs."""
    run = im.init(project="bench", upload_mode="spool", spool_dir=spool)

    def work() -> float:
        return sum(i * i for i in range(200))  # a few µs of "training"

    with_cm, without, inside = [], [], []
    for block in range(20):
        start = time.perf_counter_ns()
        for step in range(block * steps, block * steps + steps):
            t0 = time.perf_counter_ns()
            with run.rank_step(step, rank=0, world_size=8) as s:
                t1 = time.perf_counter_ns()
                with s.forward():
                    value = work()
                t2 = time.perf_counter_ns()
                s.log({"train/loss": value})
            t3 = time.perf_counter_ns()
            inside.append((t1 - t0) + (t3 - t2))  # entering; s.log and leaving (the log call)
        with_cm.append((time.perf_counter_ns() - start) / steps)
        start = time.perf_counter_ns()
        for _ in range(steps):
            work()
        without.append((time.perf_counter_ns() - start) / steps)
    run.finish()
    diff = statistics.median(with_cm) - statistics.median(without)
    return diff / 1000, statistics.median(inside) / 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[str, list[float]] = {}
        for trial in range(args.trials):
            for every in (1, 50):
                spool = str(Path(tmp) / f"s{trial}-{every}")
                rows.setdefault(f"Lightning callback, logging every {every}", []).append(
                    lightning_cost(args.steps, every, spool + "l")
                )
                rows.setdefault(f"Hugging Face callback, logging every {every}", []).append(
                    hf_cost(args.steps // 4, every, spool + "h", str(Path(tmp) / "out"))
                )
            diff, inside = rank_step_cost(args.steps // 10, str(Path(tmp) / f"r{trial}"))
            rows.setdefault("rank_step, every step (loop with vs without)", []).append(diff)
            rows.setdefault("rank_step, every step (timed around it)", []).append(inside)
        print(f"per optimizer step, CPU, spool mode; medians over {args.trials} trials")
        for name, values in rows.items():
            print(f"  {name:48} {statistics.median(values):8.1f} µs   (trials: "
                  f"{', '.join(f'{v:.1f}' for v in values)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
