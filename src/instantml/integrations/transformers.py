"""Per-rank logging from Hugging Face's ``Trainer``:
``Trainer(..., callbacks=[InstantMLCallback(project=...)])``.

Every rank logs into the one run of the job, every ``logging_steps`` optimizer steps: its
own loss as ``train/loss``, on the scale the Trainer reports (its mean over the ranks is
the Trainer's logged ``loss``), ``perf/step_time_ms``,
``perf/data_wait_ms`` (from the end of the last step: the batches' fetch),
``perf/forward_ms`` (the model's forward passes of the step, timed by hooks on the model),
``system/*``. Rank 0 also logs the Trainer's own logs (its averaged loss, learning rate,
grad norm, eval metrics) as run-level scalars, and the training arguments and model
config, once.

The ranks agree on the run id through ``torch.distributed`` (a broadcast from rank 0)
when a process group is up: accelerate launch, deepspeed and torchrun's static rendezvous
without ``--rdzv-id`` export no job id they share.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ..sdk.run import Run
from ._common import RankSteps, agree_on_run_id, jsonable, start_run


def _broadcast(mine: str) -> str:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return mine
    box = [mine]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def _loss_scale(args: Any, kwargs: dict[str, Any]) -> float | None:
    """How the Trainer scales this forward's loss into the step's, or None when it averages
    the micro-batches' losses. Given ``num_items_in_batch`` (the step's label tokens), the
    model divides its token losses by it, so the micro-batches' losses add up to the
    step's; with ``average_tokens_across_devices`` (transformers' default) that count is
    every rank's, and the Trainer multiplies by the processes to get the rank's own."""
    if kwargs.get("num_items_in_batch") is None:
        return None
    if not getattr(args, "average_tokens_across_devices", False):
        return 1.0
    return float(args.world_size if getattr(args, "n_gpu", 1) <= 1 else args.n_gpu)


def _output_loss(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss


class InstantMLCallback(TrainerCallback):
    """A ``TrainerCallback`` that logs every rank's loss and timing into one run."""

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        *,
        run_id: str | None = None,
        logging_steps: int | None = None,
        **init_kwargs: Any,
    ) -> None:
        """``init_kwargs`` go to :func:`instantml.init` (``upload_mode``, ``base_url``,
        ``api_key``, ``spool_dir``...). ``logging_steps`` defaults to the Trainer's."""
        self.project, self.name, self.config, self.tags = project, name, config, tags
        self._run_id = run_id
        self._every = logging_steps
        self._init_kwargs = init_kwargs
        self.run: Run | None = None
        self._steps: RankSteps | None = None
        self._hooks: list[Any] = []
        self._args: Any = None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        if self.run is not None:
            return
        self._args = args
        rank = args.process_index
        run_id = agree_on_run_id(self._run_id, rank, _broadcast)
        self.run = start_run(self.project, run_id, self._init_kwargs, self.name, self.tags)
        every = self._every or int(args.logging_steps) or 1
        local = args.local_process_index if args.world_size > 1 else 0
        self._steps = RankSteps(self.run, rank, args.world_size, local, every)
        if state.is_world_process_zero:
            model_config = getattr(model, "config", None)
            config = {
                # to_dict keeps None as None (to_sanitized_dict writes it as "None").
                **(args.to_dict() if hasattr(args, "to_dict") else {}),
                **(
                    {f"model/{k}": v for k, v in model_config.to_dict().items()}
                    if model_config
                    else {}
                ),
                **(self.config or {}),
            }
            self.run.log_config(jsonable(config))
        if model is not None:
            self._hooks = [
                model.register_forward_pre_hook(self._forward_start),
                model.register_forward_hook(self._forward_end, with_kwargs=True),
            ]

    def _forward_start(self, module: Any, args: Any) -> None:
        steps = self._steps
        if steps is not None and steps.clock.running and module.training:
            steps.clock.forward_start()

    def _forward_end(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        steps = self._steps
        if steps is not None and steps.clock.running and module.training:
            steps.clock.forward_end()
            if steps.logging:
                loss = _output_loss(output)
                if loss is not None:
                    scale = _loss_scale(self._args, kwargs)
                    steps.summed = scale is not None
                    steps.keep_loss(loss if scale in (None, 1.0) else loss.detach() * scale)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._steps is not None:
            self._steps.begin(state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._steps is not None:
            self._steps.end(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if self.run is None or not state.is_world_process_zero or not logs:
            return
        scalars = {
            k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if scalars:
            self.run.log(scalars, step=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.run is not None:
            self.run.finish()


__all__ = ["InstantMLCallback"]
