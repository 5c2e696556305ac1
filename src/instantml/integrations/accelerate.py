"""Hugging Face Accelerate: every process of ``accelerate launch`` logs its own values.

Two parts, usable together::

    from instantml.integrations.accelerate import InstantMLTracker, RankLogger

    accelerator = Accelerator(log_with=InstantMLTracker(project="p"))
    accelerator.init_trackers("p", config=vars(args))       # rank 0's run config
    ranks = RankLogger(accelerator, project="p")             # on every process
    for step, batch in enumerate(loader, 1):
        with ranks.step(step) as s:                          # perf/step_time_ms, ...
            with s.forward():
                loss = model(batch)
            accelerator.backward(loss)
            s.log({"train/loss": loss})                      # this process's own loss
        accelerator.log({"lr": lr}, step=step)               # rank 0's scalars
    accelerator.end_training()

``InstantMLTracker`` is an Accelerate tracker (``log_with=``): Accelerate calls it on the
main process only, so it carries rank 0's run-level scalars and config. ``RankLogger``
logs per rank into the same run: the processes agree on rank 0's run id through
Accelerate's own broadcast (``accelerate launch`` sets ``TORCHELASTIC_RUN_ID=none``, so
without it each rank would make a run of its own), and each logs with its
``process_index``, ``num_processes`` and ``local_process_index``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..sdk import config as sdk_config
from ..sdk.run import Run
from ._common import jsonable, start_run

try:
    from accelerate.tracking import GeneralTracker
except ImportError as exc:  # pragma: no cover - the message says what to install
    raise ImportError(
        "instantml.integrations.accelerate needs Accelerate: pip install accelerate"
    ) from exc

_RUNS: dict[str, Run] = {}  # one run per id in this process: tracker and logger share it


def _run(project: str | None, run_id: str, init_kwargs: dict[str, Any]) -> Run:
    run = _RUNS.get(run_id)
    if run is None or run.finished:
        run = _RUNS[run_id] = start_run(project, run_id, init_kwargs)
    return run


def _agreed_run_id(accelerator: Any, run_id: str | None) -> str:
    """Rank 0's run id on every process (one run for the job)."""
    mine = sdk_config.resolve_run_id(run_id) if accelerator.is_main_process else ""
    if accelerator.num_processes == 1:
        return mine
    from accelerate.utils import broadcast_object_list

    return str(broadcast_object_list([mine], from_process=0)[0])


class InstantMLTracker(GeneralTracker):
    """``Accelerator(log_with=InstantMLTracker(project=...))``: rank 0's scalars and config.
    ``run_id``: the job's run (default: ``INSTANTML_RUN_ID``, the launcher's job id, or a
    new one; a :class:`RankLogger` made after it uses the same run)."""

    name = "instantml"
    requires_logging_directory = False
    main_process_only = True

    def __init__(
        self, project: str | None = None, run_id: str | None = None, **init_kwargs: Any
    ) -> None:
        super().__init__()
        self.project = project
        self.run_id = sdk_config.resolve_run_id(run_id)
        self._init_kwargs = init_kwargs
        self._run: Run | None = None

    @property
    def tracker(self) -> Run:
        if self._run is None:
            self._run = _run(self.project, self.run_id, self._init_kwargs)
        return self._run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.log_config(jsonable(dict(values)))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numbers = {k: v for k, v in values.items() if hasattr(v, "__float__")}
        if numbers:
            if step is None:
                self.tracker.log(numbers)
            else:
                self.tracker.log_metrics(numbers, step=step)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()


class RankLogger:
    """Per-rank logging from every process of an Accelerate job, into the job's one run.

    ``run_id``: as :class:`InstantMLTracker`'s (rank 0's is used by every process); a
    tracker made on rank 0 before this logger shares its run. ``init_kwargs`` go to
    :func:`instantml.init` (``upload_mode``, ``spool_dir``...)."""

    def __init__(
        self,
        accelerator: Any,
        project: str | None = None,
        run_id: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        self.accelerator = accelerator
        if run_id is None and accelerator.is_main_process:
            for tracker in getattr(accelerator, "trackers", []):
                if isinstance(tracker, InstantMLTracker):
                    run_id = tracker.run_id
        agreed = _agreed_run_id(accelerator, run_id)
        self.run = _run(project, agreed, init_kwargs)
        self.rank = int(accelerator.process_index)
        self.world_size = int(accelerator.num_processes)
        self.local_rank = int(accelerator.local_process_index)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """This process's values at a global step (tensors are read without a sync of
        their own: a CUDA tensor once its device produced it)."""
        self.run.log_rank_metrics(
            metrics, step, rank=self.rank, world_size=self.world_size, local_rank=self.local_rank
        )

    @contextmanager
    def step(self, step: int, *, every: int = 1, system: bool = True) -> Iterator[Any]:
        """Time one optimizer step on this process: ``perf/step_time_ms``,
        ``perf/data_wait_ms``, ``perf/forward_ms`` (inside ``with s.forward():``) and what
        ``s.log({...})`` adds, every ``every`` steps (``Run.rank_step``)."""
        with self.run.rank_step(
            step, every=every, rank=self.rank, world_size=self.world_size,
            local_rank=self.local_rank, system=system,
        ) as timed:  # fmt: skip
            yield timed

    def finish(self) -> bool:
        """This process's part of the run is done (``Run.finish``)."""
        return self.run.finish()
