"""Per-rank timing and system keys (docs/reference.md, "SDK"): what a step cost this rank.

Host clocks only, and no GPU synchronisation of our own: under CUDA, a section's host time
is what the host spent on it (launching kernels, waiting where the loop itself waits).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

STEP_TIME = "perf/step_time_ms"
DATA_WAIT = "perf/data_wait_ms"
FORWARD = "perf/forward_ms"
GPU_MEMORY = "system/gpu_memory_mb"
CPU_RSS = "system/cpu_rss_mb"

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm = (-1, -1)  # (pid, fd): /proc/self is resolved when opened, so a fork reopens it


def cpu_rss_mb() -> float:
    """This process's resident memory now (its peak where /proc is not there). The file
    stays open: opening it cost more than the rest of a logging call."""
    global _statm
    pid = os.getpid()
    try:
        if _statm[0] != pid:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 64, 0).split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def system_metrics() -> dict[str, float]:
    """``system/cpu_rss_mb``, and ``system/gpu_memory_mb`` (peak allocated on this
    process's device) when torch with CUDA is in use; torch is never imported here."""
    out = {CPU_RSS: cpu_rss_mb()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        out[GPU_MEMORY] = torch.cuda.max_memory_allocated() / 2**20
    return out


class StepClock:
    """One rank's step times: the data wait (from the end of the last step to the start
    of this one), the step, and the forward sections inside it (summed, so gradient
    accumulation's several forwards count together)."""

    def __init__(self) -> None:
        self._last_end: float | None = None
        self._start = 0.0
        self._forward_start: float | None = None
        self._forward = 0.0
        self._forwards = 0
        self.running = False

    def start(self) -> None:
        self._start = time.perf_counter()
        self._forward = 0.0
        self._forwards = 0
        self._forward_start = None
        self.running = True

    def forward_start(self) -> None:
        self._forward_start = time.perf_counter()

    def forward_end(self) -> None:
        start = self._start if self._forward_start is None else self._forward_start
        self._forward += time.perf_counter() - start
        self._forwards += 1
        self._forward_start = None

    def end(self) -> dict[str, float]:
        """The step's timing keys, in milliseconds."""
        now = time.perf_counter()
        timing = {STEP_TIME: (now - self._start) * 1000}
        if self._last_end is not None:
            timing[DATA_WAIT] = (self._start - self._last_end) * 1000
        if self._forwards:
            timing[FORWARD] = self._forward * 1000
        self._last_end = now
        self.running = False
        return timing


class RankStep:
    """What ``Run.rank_step`` yields: mark the forward section, give values to log."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self.values: dict[str, object] = {}

    @contextmanager
    def forward(self) -> Iterator[None]:
        """The rank-local compute section (the forward pass) whose time points at a
        straggler."""
        self._clock.forward_start()
        try:
            yield
        finally:
            self._clock.forward_end()

    def log(self, metrics: dict[str, object]) -> None:
        """Values to log with this step's timing keys (numbers or 0-dim tensors)."""
        self.values.update(metrics)
