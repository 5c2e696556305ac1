"""Finishing runs the process did not finish itself: at exit, on SIGTERM, after a crash.

A run still open at interpreter exit is finished (``failed`` when an uncaught exception
ended the program). SIGTERM (how torchrun and SLURM stop workers) finishes open runs as
``crashed`` and then lets the signal do what it would have done.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import Run

_runs: list[Run] = []
_lock = threading.Lock()
_installed = False
_uncaught = False
_previous_term: Any = None


def track(run: Run) -> None:
    with _lock:
        _runs.append(run)
        _install()


def forget(run: Run) -> None:
    with _lock:
        if run in _runs:
            _runs.remove(run)


def _finish_all(status: str, timeout: float | None = None) -> None:
    with _lock:
        runs = list(_runs)
    for run in runs:
        with contextlib.suppress(Exception):
            run.finish(status, timeout=timeout)


def _at_exit() -> None:
    _finish_all("failed" if _uncaught else "finished")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _finish_all("crashed", timeout=5.0)
    previous = _previous_term
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    global _uncaught
    if not issubclass(exc_type, KeyboardInterrupt):
        _uncaught = True
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.excepthook


def _install() -> None:
    global _installed, _previous_term, _previous_excepthook
    if _installed:
        return
    _installed = True
    atexit.register(_at_exit)
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGTERM)
        # Only take SIGTERM when nobody else did; a framework's own handler stays in charge.
        if current in (signal.SIG_DFL, None):
            _previous_term = current
            signal.signal(signal.SIGTERM, _on_sigterm)
