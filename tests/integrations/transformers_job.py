"""A Hugging Face Trainer job on CPU: a tiny GPT-2 built from a config (no downloads),
under torchrun with 2 processes (gloo). Run by tests/integrations/test_transformers.py."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from instantml.integrations.transformers import InstantMLCallback

PROJECT, OUTPUT = sys.argv[1], sys.argv[2]
# transformers' default averages the loss over every rank's tokens; gradient accumulation
# makes each optimizer step several forwards.
AVERAGE = sys.argv[3] == "average" if len(sys.argv) > 3 else True
ACCUMULATE = int(sys.argv[4]) if len(sys.argv) > 4 else 1


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (256, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


if __name__ == "__main__":
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    )
    args = TrainingArguments(
        output_dir=OUTPUT,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=ACCUMULATE,
        average_tokens_across_devices=AVERAGE,
        max_steps=8,
        logging_steps=2,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        callbacks=[InstantMLCallback(project=PROJECT, name="hf-tiny-gpt2")],
    )
    trainer.train()
