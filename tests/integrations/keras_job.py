"""One rank of a Keras 3 job on the CPU (torch backend): each process trains on its own
shard (Keras has no multi-process data parallelism on this backend: the ranks do not
synchronise gradients) and logs into the job's one run through ``InstantMLCallback``.
Rank 1's shard is noisier. The launcher's environment gives RANK, WORLD_SIZE and
INSTANTML_RUN_ID, as torchrun or srun would."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

from instantml.integrations.keras import InstantMLCallback


def main() -> None:
    rank = int(os.environ["RANK"])
    rng = np.random.default_rng(10 + rank)
    x = rng.normal(size=(256, 4)).astype("float32")
    noise = 0.5 if rank == 1 else 0.05
    y = (x.sum(axis=1, keepdims=True) + noise * rng.normal(size=(256, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse")
    model.fit(
        x, y, batch_size=32, epochs=2, validation_split=0.25, verbose=0,
        callbacks=[InstantMLCallback(project="keras-job", log_every_n_steps=2)],
    )  # fmt: skip


if __name__ == "__main__":
    main()
