"""What the framework callbacks share: one run for every rank of the job, and per-rank
steps (timing, system keys, the rank's own loss) logged every N optimizer steps.

The frameworks log from rank 0 only (Lightning's ``Logger.log_metrics`` is rank-zero-only;
Hugging Face's callbacks check ``is_world_process_zero``), which is what hides a bad rank:
here every rank logs its own values into the one run of the job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import sdk
from ..sdk import config as sdk_config
from ..sdk.run import Run
from ..sdk.timing import StepClock, system_metrics

LOSS = "train/loss"


def agree_on_run_id(run_id: str | None, rank: int, broadcast: Callable[[str], str]) -> str:
    """Every rank of the job on one id: rank 0's (``run_id=``, ``INSTANTML_RUN_ID``, the
    launcher's job id, else a new one), sent to the others by the framework's broadcast.
    Lightning's own DDP launcher sets no job id that all ranks share, so without this each
    rank would log into a run of its own."""
    mine = sdk_config.resolve_run_id(run_id) if rank == 0 else ""
    return broadcast(mine)


def jsonable(config: dict[str, Any]) -> dict[str, Any]:
    """A config whose values JSON can carry (anything else as its text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if value is None or isinstance(value, (bool, int, str)):
            out[str(key)] = value
        elif isinstance(value, float):
            out[str(key)] = value if math.isfinite(value) else str(value)
        elif isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value
        ):
            out[str(key)] = list(value)
        else:
            out[str(key)] = str(value)
    return out


class RankSteps:
    """One rank's side of a run: its clock, its pending losses, when to log."""

    def __init__(self, run: Run, rank: int, world_size: int, local_rank: int | None, every: int):
        self.run = run
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.every = max(1, every)
        self.clock = StepClock()
        self.losses: list[Any] = []  # this optimizer step's losses (one per micro-batch)
        # Whether the micro-batches' losses are parts of the step's (summed), not each a
        # loss of its own (averaged): Hugging Face divides by the step's token count.
        self.summed = False
        self.logging = False  # whether the step under way will be logged

    def begin(self, step: int) -> None:
        """Optimizer step ``step`` (the number it will have once done) starts its first
        micro-batch (later ones keep the clock)."""
        if not self.clock.running:
            self.clock.start()
            self.losses = []
            self.logging = step % self.every == 0

    def keep_loss(self, loss: Any) -> None:
        """A micro-batch's loss, kept only on a step that will be logged."""
        if self.logging:
            self.losses.append(loss.detach() if hasattr(loss, "detach") else loss)

    def end(self, step: int) -> None:
        """The optimizer step ``step`` (counted from 1 after the first) is done: log this
        rank's keys when it is a logging step."""
        if not self.clock.running:
            return
        timing = self.clock.end()
        if step % self.every:
            return
        values: dict[str, Any] = {**timing, **system_metrics()}
        if self.losses:
            values[LOSS] = (
                self.losses[0] if len(self.losses) == 1 else _combine(self.losses, self.summed)
            )
        self.run.log_rank_metrics(
            values, step, rank=self.rank, world_size=self.world_size, local_rank=self.local_rank
        )


def _combine(losses: list[Any], summed: bool) -> Any:
    """The sum, or the mean, of micro-batch losses (tensors stay tensors: no device sync
    here)."""
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total if summed else total / len(losses)


def start_run(
    project: str | None,
    run_id: str,
    init_kwargs: dict[str, Any],
    name: str | None = None,
    tags: list[str] | None = None,
) -> Run:
    return sdk.init(project=project, name=name, tags=tags, run_id=run_id, **init_kwargs)
