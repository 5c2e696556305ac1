"""A real Accelerate job, as ``accelerate launch --multi_gpu --num_processes 2`` runs it on
the CPU (gloo): DDP of a small model, every process logging its own loss and timing with
``RankLogger``, rank 0's scalars and config through ``InstantMLTracker``. Process 1's
shard is noisier, so the two ranks' losses differ."""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator

from instantml.integrations.accelerate import InstantMLTracker, RankLogger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, log_with=InstantMLTracker(project="accelerate-job"))
    accelerator.init_trackers("accelerate-job", config={"lr": 0.05, "steps": args.steps})
    ranks = RankLogger(accelerator, project="accelerate-job")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(100 + accelerator.process_index)
    noise = 0.5 if accelerator.process_index == 1 else 0.05
    for step in range(1, args.steps + 1):
        with ranks.step(step, system=False) as s:
            x = torch.randn(16, 8, generator=gen)
            y = x.sum(dim=1, keepdim=True) + noise * torch.randn(16, 1, generator=gen)
            with s.forward():
                loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            s.log({"train/loss": loss.detach()})
        accelerator.log({"lr": 0.05, "train/loss_rank0": float(loss)}, step=step)
    ranks.finish()
    accelerator.end_training()


if __name__ == "__main__":
    main()
