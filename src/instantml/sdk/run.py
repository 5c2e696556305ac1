"""``im.init`` and the ``Run`` a training process logs through."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from .. import validation
from ..thresholds import check
from . import config as sdk_config
from . import lifecycle
from .async_sender import AsyncSender
from .deferred import Deferred, holds_cuda
from .sinks import Sink, SyncSink
from .timing import RankStep, StepClock, system_metrics
from .transport import Transport

UPLOAD_MODES = ("sync", "async", "spool")
_MODULES = sys.modules


class Run:
    """One run, shared by every rank of a job. Create it with :func:`init`."""

    def __init__(
        self,
        run_id: str,
        project: str,
        sink: Sink,
        *,
        upload_mode: str,
        rank: int | None,
        world_size: int | None,
        local_rank: int | None,
        finish_timeout: float,
    ) -> None:
        self.run_id = run_id
        self.project = project
        self.upload_mode = upload_mode
        self._sink = sink
        self._rank = rank
        self._world_size = world_size
        self._local_rank = local_rank
        self._node = sdk_config.resolve_node()
        self._finish_timeout = finish_timeout
        self._metrics_path = f"/runs/{quote(run_id)}/metrics"
        self._rank_path = f"/runs/{quote(run_id)}/rank-metrics"
        self._attributes_path = f"/api/runs/{quote(run_id)}/attributes"
        self._next_step = 0
        self._deferred = Deferred()  # calls holding GPU values, until their copies are done
        self._pending = self._deferred.queue
        self._clock = StepClock()
        self._ranks_logged: set[int] = set()  # which rank finishes (one, or none is said)
        self.finished = False

    @property
    def dropped_events(self) -> int:
        """Events that will not reach the server, whatever the cause: async mode counts those
        refused, dropped from a full queue or still undelivered when ``finish`` timed out;
        spool mode those it could not write (a full disk)."""
        return int(getattr(self._sink, "dropped", 0))

    def log_rank_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        weight: float | None = None,
        timestamp: float | None = None,
    ) -> None:
        """Log this rank's values for a global step. ``rank``, ``world_size`` and
        ``local_rank`` default from the ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``
        environment variables; ``weight`` (e.g. the rank's sample count) defaults to 1.
        NaN and +-inf are logged, not raised: the summary shows which rank produced them.
        Values may be numbers or 0-dim arrays/tensors; a CUDA tensor is read once its
        device has produced it, without a synchronisation of this call's own."""
        if rank is None:
            rank = self._rank
            if rank is None:
                raise ValueError(
                    "rank is required: pass rank= or set the RANK environment variable"
                )
        if world_size is None:
            world_size = self._world_size
            if world_size is None:
                raise ValueError(
                    "world_size is required: pass world_size= or set the WORLD_SIZE environment variable"
                )
        if local_rank is None:
            local_rank = self._local_rank
        context = validation.rank_context(rank, world_size, local_rank)
        checked = (validation.step(step), *context, validation.weight(weight))
        if len(self._ranks_logged) < 2:
            self._ranks_logged.add(context[0])
        stamp = time.time() if timestamp is None else timestamp
        if self._pending or ("torch" in _MODULES and holds_cuda(metrics)):
            self._deferred.resolve()
            if self._pending or holds_cuda(metrics):
                _probe(metrics)  # names and host values checked now, where the call is made
                self._deferred.add(metrics, lambda values: self._rank_event(values, checked, stamp))
                return
        self._rank_event(metrics, checked, stamp)

    def _rank_event(
        self,
        metrics: dict[str, Any],
        checked: tuple[int, int, int, int | None, float],
        stamp: float,
    ) -> None:
        values, marks = validation.metric_values(metrics)
        step, rank, size, local_rank, weight = checked
        body = {
            "metrics": values,
            "step": step,
            "rank": rank,
            "world_size": size,
            "local_rank": local_rank,
            "weight": weight,
            "timestamp": stamp,
            "node": self._node,
        }
        if marks:
            _with_marks(body, marks)
        self._sink.submit("POST", self._rank_path, body)

    def log_metrics(
        self, metrics: dict[str, Any], step: int, timestamp: float | None = None
    ) -> None:
        """Log ordinary (run-level) scalars for a step."""
        checked_step = validation.step(step)
        self._next_step = max(self._next_step, checked_step + 1)
        stamp = time.time() if timestamp is None else timestamp
        if self._deferred:
            self._deferred.resolve()
        if self._deferred or holds_cuda(metrics):
            _probe(metrics)
            self._deferred.add(
                metrics, lambda values: self._scalar_event(values, checked_step, stamp)
            )
            return
        self._scalar_event(metrics, checked_step, stamp)

    def _scalar_event(self, metrics: dict[str, Any], step: int, stamp: float) -> None:
        values, marks = validation.metric_values(metrics)
        body = {"metrics": values, "step": step, "timestamp": stamp}
        if marks:
            _with_marks(body, marks)
        self._sink.submit("POST", self._metrics_path, body)

    def log_config(self, config: dict[str, Any]) -> None:
        """Add entries to the run's config (shown on its page beside the config it was
        created with); one rank (rank 0) is enough."""
        if not isinstance(config, dict):
            raise TypeError("config must be a dict")
        attributes = [
            {"path": f"config/{k}", "type": "config", "value": v} for k, v in config.items()
        ]
        if attributes:
            self._sink.submit("POST", self._attributes_path, {"attributes": attributes})

    @contextmanager
    def rank_step(
        self,
        step: int,
        *,
        every: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        weight: float | None = None,
        system: bool = True,
    ) -> Iterator[RankStep]:
        """Time one step of a hand-written loop and log this rank's timing keys with it
        (every ``every`` steps): ``perf/step_time_ms``, ``perf/data_wait_ms`` (from the end
        of the previous step), ``perf/forward_ms`` (sections marked with
        ``with s.forward():``), and ``system/*``; values given to ``s.log`` go with them::

            for step, batch in enumerate(loader):
                with run.rank_step(step) as s:
                    with s.forward():
                        loss = model(batch)
                    loss.backward(); optimizer.step()
                    s.log({"train/loss": loss})

        Under synchronous DDP every rank's step time is the same (the all-reduce waits for
        the slowest); the forward section is what points at a straggler."""
        clock = self._clock
        clock.start()
        current = RankStep(clock)
        yield current  # a step that raises is not logged: the loop is failing anyway
        timing = clock.end()
        if step % every == 0:
            extra = system_metrics() if system else {}
            self.log_rank_metrics(
                {**current.values, **timing, **extra},
                step,
                rank=rank,
                world_size=world_size,
                local_rank=local_rank,
                weight=weight,
            )

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log scalars; without ``step``, one past the last step this process logged."""
        self.log_metrics(metrics, self._next_step if step is None else step)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was logged is delivered (async) or written (spool)."""
        self._deferred.resolve(wait=True)
        return self._sink.flush(self._finish_timeout if timeout is None else timeout)

    def finish(self, status: str = "finished", timeout: float | None = None) -> bool:
        """Mark the run ``status`` and deliver what is pending, waiting at most ``timeout``
        seconds. Returns False when something could not be delivered in time."""
        if self.finished:
            return True
        self.finished = True
        lifecycle.forget(self)
        limit = self._finish_timeout if timeout is None else timeout
        try:
            self._deferred.resolve(wait=True)
            body: dict[str, Any] = {"status": validation.run_status(status)}
            # The rank that finishes, when this process is one rank (the server tells a
            # rank that never finished from one that did by it).
            ranks = self._ranks_logged or ({self._rank} if self._rank is not None else set())
            if len(ranks) == 1:
                body["rank"] = next(iter(ranks))
            self._sink.submit("PATCH", f"/runs/{quote(self.run_id)}", body)
        finally:
            delivered = self._sink.close(limit)
        return delivered

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        clean = exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None))
        self.finish("finished" if clean else "failed")

    def __repr__(self) -> str:
        return f"Run(run_id={self.run_id!r}, project={self.project!r}, upload_mode={self.upload_mode!r})"


_warned_unshared = False


def _warn_unshared_run(run_id: str | None) -> None:
    """Once per process: a multi-rank job whose ranks cannot agree on one run id."""
    global _warned_unshared
    message = None if _warned_unshared else sdk_config.unshared_run_warning(run_id)
    if message is not None:
        _warned_unshared = True
        warnings.warn(f"instantml: {message}", RuntimeWarning, stacklevel=3)


def _probe(metrics: dict[str, Any]) -> None:
    """Validate a call's names and host values now; its device values are read later."""
    validation.metric_values(
        {k: 0.0 if getattr(v, "is_cuda", False) else v for k, v in metrics.items()}
    )


def _with_marks(body: dict[str, Any], marks: dict[str, str]) -> None:
    """NaN and +-inf travel beside ``metrics`` (JSON has no token for them); a body whose
    values are all non-finite carries only the marks."""
    body["nonfinite"] = marks
    if not body["metrics"]:
        del body["metrics"]


def init(
    project: str | None = None,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    upload_mode: str = "async",
    spool_dir: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    timeout: float = 10.0,
    finish_timeout: float = 30.0,
    spool_fsync: str = "periodic",
    spool_uploader: bool = False,
    transport: httpx.BaseTransport | None = None,
    health: dict[str, Any] | None = None,
) -> Run:
    """Start (or join) a run.

    Every rank of a job must land in one run: the id comes from ``run_id=``, else
    ``INSTANTML_RUN_ID``, else the launcher's job id (``TORCHELASTIC_RUN_ID``,
    ``SLURM_JOB_ID``), else a fresh id. Creating a run whose id exists attaches to it.

    ``upload_mode``: ``"async"`` (default; a background thread batches uploads and never
    blocks training), ``"sync"`` (one HTTP request per call, errors raised), or ``"spool"``
    (no network at all: events are appended to files under ``spool_dir``, default
    ``.instantml/spool``, for ``instantml sync`` to upload; ``spool_uploader=True`` starts
    that uploader in the background, outliving this process until the spool is drained).
    ``spool_fsync``: ``"periodic"`` (default, once a second), ``"event"`` or ``"none"``.
    ``transport``: an httpx transport for the sync and async modes to send through (an
    ``httpx.ASGITransport`` in tests, a proxy, a fault injector); default: the network.
    ``health``: this run's run-health thresholds over the server's (docs/reference.md,
    "Run health"), e.g. ``{"missing_steps": 5, "straggler_score": 0.6}``; kept as
    ``health/*`` attributes.
    """
    if upload_mode not in UPLOAD_MODES:
        raise ValueError(
            f"upload_mode must be one of {', '.join(UPLOAD_MODES)}, got {upload_mode!r}"
        )
    thresholds = [
        {"path": f"health/{name}", "type": "health", "value": check(name, value, "health")}
        for name, value in (health or {}).items()
    ]
    resolved_id = sdk_config.resolve_run_id(run_id)
    env = os.environ
    _warn_unshared_run(run_id)
    rank, world_size, local_rank = sdk_config.launcher_ranks(env)
    body: dict[str, Any] = {"project": project or "default", "id": resolved_id}
    if name is not None:
        body["name"] = name
    for field, value in (("config", config), ("tags", tags), ("metadata", metadata)):
        if value is not None:
            body[field] = value
    url, key = sdk_config.resolve_base_url(base_url), sdk_config.resolve_api_key(api_key)
    sink: Sink
    if upload_mode == "spool":
        from ..spool.writer import SpoolWriter

        directory = spool_dir or os.environ.get("INSTANTML_SPOOL_DIR") or ".instantml/spool"
        sink = SpoolWriter(directory, resolved_id, fsync=spool_fsync)
        if spool_uploader:
            from ..spool.background import start_background_uploader

            start_background_uploader(directory, url, key)
    elif upload_mode == "sync":
        sink = SyncSink(Transport(url, key, timeout, transport))
    else:
        sink = AsyncSender(Transport(url, key, timeout, transport))
    # Run creation is an ordinary event: in async mode init never waits on the server.
    try:
        sink.create_run(body)
        if thresholds:
            attributes_path = f"/api/runs/{quote(resolved_id)}/attributes"
            sink.submit("POST", attributes_path, {"attributes": thresholds})
    except BaseException:
        sink.close(0)
        raise
    run = Run(
        resolved_id,
        body["project"],
        sink,
        upload_mode=upload_mode,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        finish_timeout=finish_timeout,
    )
    lifecycle.track(run)
    return run
