"""Metric values that live on a GPU, read without a synchronisation of their own.

``tensor.item()`` on a CUDA tensor waits for the device; a logging call must not. So a call
that holds CUDA values copies them to the host without blocking, records a CUDA event
behind the copy, and is logged once the event has completed: checked (never waited for)
at every later call, and waited for at ``flush`` and ``finish``. Calls queued behind a
pending one stay behind it, so their order (the later write of a point wins) is kept.

torch is only ever touched here when the values are torch tensors: ``import instantml``
never imports it.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any

_Call = tuple[Any, dict[str, Any], Callable[[dict[str, Any]], None]]  # (event or None, values, log)


def holds_cuda(metrics: dict[str, Any]) -> bool:
    """Whether any value is a CUDA tensor (cheap when torch is not loaded)."""
    if "torch" not in sys.modules:
        return False
    return any(type(v) is not float and getattr(v, "is_cuda", False) for v in metrics.values())


class Deferred:
    def __init__(self) -> None:
        # Public so the log calls test it as a plain deque (C-level truthiness): an empty
        # queue must cost the hot path nothing.
        self.queue: deque[_Call] = deque()

    def add(self, metrics: dict[str, Any], log: Callable[[dict[str, Any]], None]) -> None:
        """Queue a call: its CUDA values copied to the host (non-blocking) behind an event."""
        event = None
        if holds_cuda(metrics):
            import torch

            host: dict[str, Any] = {}
            for key, value in metrics.items():
                if type(value) is not float and getattr(value, "is_cuda", False):
                    if value.dim() != 0:
                        raise TypeError(f"metrics[{key!r}] must be a number or a 0-dim tensor")
                    host[key] = value.detach().to("cpu", non_blocking=True)
                else:
                    host[key] = value
            event = torch.cuda.Event()
            event.record()
            metrics = host
        self.queue.append((event, metrics, log))

    def resolve(self, wait: bool = False) -> None:
        """Log, in order, the queued calls whose copies are done (all, waiting, if ``wait``)."""
        queue = self.queue
        while queue:
            event = queue[0][0]
            if event is not None:
                if wait:
                    event.synchronize()
                elif not event.query():
                    return
            _, values, log = queue.popleft()
            log(values)
