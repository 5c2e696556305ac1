"""A real DDP job on CPU (gloo) that logs every rank to InstantML.

    torchrun --standalone --nproc-per-node 4 examples/torchrun_ddp.py

Each rank trains the same small model on its own shard of a synthetic regression task;
rank 2's shard is noisier. Every rank logs its own loss, gradient norm and timing for each
global step, so the run's Distributed tab shows rank 2 apart.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import instantml as im

STEPS = int(os.environ.get("STEPS", "100"))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.linspace(-1, 1, 16)
    noise = 0.5 if rank == 2 else 0.05
    # torchrun --standalone gives every rank the same TORCHELASTIC_RUN_ID: one run.
    run = im.init(project="torchrun-ddp", config={"lr": 0.05, "world_size": world})
    for step in range(STEPS):
        with run.rank_step(step) as s:
            x = torch.randn(64, 16)
            y = x @ true_w + noise * torch.randn(64)
            with s.forward():
                loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            s.log({"train/loss": loss.detach(), "optimizer/grad_norm": grad_norm})
    if rank == 0:
        print(f"run {run.run_id}: {STEPS} steps x {world} ranks logged")
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
