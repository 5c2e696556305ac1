"""A Lightning DDP job on CPU (gloo), 4 processes through Lightning's own launcher: rank
SLOW_RANK's training_step is slower. Run by tests/integrations/test_lightning.py."""

import sys
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from instantml.integrations.lightning import InstantMLCallback

PROJECT, SLOW_RANK = sys.argv[1], int(sys.argv[2])


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters({"lr": 0.05, "hidden": 8})
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        # A forward of ~10 ms on every rank (a tiny model's ~1 ms forward would make the
        # ranks' medians differ by scheduling jitter alone on a loaded machine), 40 ms on
        # one: a straggler.
        time.sleep(0.04 if self.global_rank == SLOW_RANK else 0.01)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=4,
        strategy="ddp",
        max_steps=30,
        log_every_n_steps=1,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=10,  # epochs of 16 steps: validation after steps 10 and 26
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[InstantMLCallback(project=PROJECT, name="lightning-ddp")],
    )
    trainer.fit(Model(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
