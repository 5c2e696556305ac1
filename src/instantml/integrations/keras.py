"""Per-rank logging from Keras 3: ``model.fit(..., callbacks=[InstantMLCallback(project=...)])``.

Every process of the job logs into its one run, every ``log_every_n_steps`` batches: its
own loss as ``train/loss``, ``perf/step_time_ms`` and ``perf/data_wait_ms`` (a Keras batch
is not split into a forward section it reports), and ``system/*``. Rank 0 also logs the
epoch's metrics (``loss``, ``val_loss``, ...) as run-level scalars at the step the epoch
ended, and the model's optimizer settings as config, once.

The rank, world size and local rank come from the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``; SLURM's inside ``srun``) unless given; the run id from
``run_id=``, ``INSTANTML_RUN_ID`` or the launcher's job id, as ``instantml.init`` finds it
(Keras has no broadcast of its own across processes to agree on one).

Keras reports a batch's loss as the epoch's running mean so far; this callback logs the
batch's own loss, recovered from consecutive means (exact when the epoch's batches are of
one size, as all but a last partial batch are).
"""

from __future__ import annotations

from typing import Any

from ..sdk import config as sdk_config
from ..sdk import init
from ..sdk.run import Run
from ._common import LOSS, RankSteps, jsonable

try:
    import keras
except ImportError as exc:  # pragma: no cover - the message says what to install
    raise ImportError(
        "instantml.integrations.keras needs Keras 3 and a backend it can load: pip install"
        f" keras, and KERAS_BACKEND=torch (or jax, tensorflow) installed ({exc})"
    ) from exc


class InstantMLCallback(keras.callbacks.Callback):
    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        *,
        run_id: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        log_every_n_steps: int = 50,
        **init_kwargs: Any,
    ) -> None:
        """``init_kwargs`` go to :func:`instantml.init` (``upload_mode``, ``base_url``,
        ``api_key``, ``spool_dir``...)."""
        super().__init__()
        self.project, self.name, self.config_values, self.tags = project, name, config, tags
        self._run_id = run_id
        self._rank, self._world_size, self._local_rank = rank, world_size, local_rank
        self._every = log_every_n_steps
        self._init_kwargs = init_kwargs
        self.run: Run | None = None
        self._steps: RankSteps | None = None
        self._step = 0  # optimizer steps done in this fit
        self._batches = 0  # batches of the epoch under way
        self._mean = 0.0  # Keras' running mean of the epoch's loss after the last batch

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.run is None:
            self.run = init(
                project=self.project, name=self.name, tags=self.tags,
                run_id=sdk_config.resolve_run_id(self._run_id), **self._init_kwargs,
            )  # fmt: skip
        env_rank, env_size, env_local = sdk_config.launcher_ranks()
        rank = self._rank if self._rank is not None else env_rank or 0
        world_size = self._world_size if self._world_size is not None else env_size or 1
        local_rank = self._local_rank if self._local_rank is not None else env_local
        self._steps = RankSteps(self.run, rank, world_size, local_rank, self._every)
        if rank == 0:
            settings: dict[str, Any] = dict(self.config_values or {})
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and hasattr(optimizer, "get_config"):
                settings.update({f"optimizer/{k}": v for k, v in optimizer.get_config().items()})
            if settings:
                self.run.log_config(jsonable(settings))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._batches, self._mean = 0, 0.0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._steps is not None:
            self._steps.begin(self._step + 1)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self._steps
        if steps is None:
            return
        self._step += 1
        self._batches += 1
        running = (logs or {}).get("loss")
        if running is not None:
            mean = float(running)
            # The running mean after n batches of one size: this batch's is the difference.
            own = mean * self._batches - self._mean * (self._batches - 1)
            self._mean = mean
            steps.keep_loss(own)
        steps.end(self._step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self._steps
        if steps is None or steps.rank != 0 or not logs:
            return
        numbers = {k: float(v) for k, v in logs.items() if hasattr(v, "__float__")}
        numbers["epoch"] = float(epoch + 1)
        steps.run.log_metrics(numbers, step=self._step)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.run is not None:
            self.run.finish()


__all__ = ["LOSS", "InstantMLCallback"]
