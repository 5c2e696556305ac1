"""Per-rank logging from Lightning: ``Trainer(callbacks=[InstantMLCallback(project=...)])``.

Every rank logs into the one run of the job, every ``log_every_n_steps`` optimizer steps:
its own loss (``training_step``'s, before any cross-rank mean) as ``train/loss``,
``perf/step_time_ms``, ``perf/data_wait_ms``, ``perf/forward_ms`` (``training_step``: the
rank-local section that points at a straggler under synchronous DDP), ``system/*``. Rank 0
also logs the trainer's ordinary metrics (``self.log``) as run-level scalars, and the
module's hyperparameters as config, once.

The ranks agree on the run id through the strategy's broadcast (Lightning's own DDP
launcher sets no job id they share). Works with ``lightning`` and ``pytorch_lightning``.
"""

from __future__ import annotations

from typing import Any

from ..sdk.run import Run
from ._common import RankSteps, agree_on_run_id, jsonable, start_run


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    try:
        from lightning.pytorch import Callback as LightningCallback

        bases.append(LightningCallback)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as PLCallback

        if PLCallback not in bases:
            bases.append(PLCallback)
    except ImportError:
        pass
    if not bases:
        raise ImportError(
            "instantml.integrations.lightning needs Lightning: pip install lightning"
            " (or pytorch_lightning)"
        )
    return tuple(bases)


class _Hooks:
    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        *,
        run_id: str | None = None,
        log_every_n_steps: int | None = None,
        **init_kwargs: Any,
    ) -> None:
        """``init_kwargs`` go to :func:`instantml.init` (``upload_mode``, ``base_url``,
        ``api_key``, ``spool_dir``...). ``log_every_n_steps`` defaults to the trainer's."""
        super().__init__()
        self.project, self.name, self.config, self.tags = project, name, config, tags
        self._run_id = run_id
        self._every = log_every_n_steps
        self._init_kwargs = init_kwargs
        self.run: Run | None = None
        self._steps: RankSteps | None = None
        self._step_at_start = -1
        self._logged: dict[str, Any] = {}  # each scalar's value as last logged (rank 0)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.run is not None:
            return
        rank = trainer.global_rank
        run_id = agree_on_run_id(
            self._run_id, rank, lambda mine: trainer.strategy.broadcast(mine, src=0)
        )
        self.run = start_run(self.project, run_id, self._init_kwargs, self.name, self.tags)
        every = int(self._every or getattr(trainer, "log_every_n_steps", None) or 50)
        self._steps = RankSteps(self.run, rank, trainer.world_size, trainer.local_rank, every)
        if rank == 0:
            hparams = dict(getattr(pl_module, "hparams", {}) or {})
            config = jsonable({**hparams, **(self.config or {})})
            if config:
                self.run.log_config(config)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        steps = self._steps
        if steps is not None:
            if not steps.clock.running:
                self._step_at_start = trainer.global_step
            steps.begin(trainer.global_step + 1)
            steps.clock.forward_start()  # the training_step runs from here...

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        steps = self._steps
        if steps is not None and steps.clock.running:
            steps.clock.forward_end()  # ...to here (each micro-batch's, summed)
            steps.keep_loss(loss)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        steps = self._steps
        if steps is None or trainer.global_step == self._step_at_start:
            return  # accumulating gradients: the optimizer step is not done yet
        if steps.logging and not steps.losses:  # manual optimisation, no manual_backward
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and not isinstance(loss, dict):
                steps.keep_loss(loss)
        steps.end(trainer.global_step)
        if steps.rank == 0 and trainer.global_step % steps.every == 0:
            self._log_scalars(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._steps is not None and self._steps.rank == 0 and not trainer.sanity_checking:
            self._log_scalars(trainer)

    def _log_scalars(self, trainer: Any) -> None:
        """Rank 0's scalars: those ``callback_metrics`` holds anew since the last log. It
        keeps the last validation's values (``val_loss``) through every training step
        after it, as the same objects: those are logged when they change (compared by
        identity, so no device value is read to compare)."""
        assert self.run is not None
        scalars = {
            str(k): v
            for k, v in trainer.callback_metrics.items()
            if getattr(v, "ndim", 0) == 0 and not isinstance(v, (str, bool))
            and self._logged.get(str(k)) is not v
        }  # fmt: skip
        if scalars:
            self._logged.update(scalars)
            self.run.log(scalars, step=trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.run is not None:
            self.run.finish("failed")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.run is not None and stage == "fit":
            self.run.finish()


class InstantMLCallback(_Hooks, *_callback_bases()):  # type: ignore[misc]
    """A Lightning ``Callback`` that logs every rank's loss and timing into one run."""


__all__ = ["InstantMLCallback"]
