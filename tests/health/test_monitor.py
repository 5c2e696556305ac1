"""How often the monitor looks at a run: every ``interval`` while a look is cheap, less
often on a busy server (a look's share of the time bounded), never further apart than
``MAX_GAP``. The monitor's real thread and clock; only the look itself is replaced, by
one that takes a set time."""

from __future__ import annotations

import time
from typing import cast

import numpy as np

from instantml.health import monitor
from instantml.health.monitor import HealthMonitor
from instantml.storage.protocols import Stores
from instantml.storage.records import AlertRecord
from instantml.thresholds import Thresholds


class TimedLooks(HealthMonitor):
    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.starts: list[float] = []
        super().__init__(cast(Stores, None), Thresholds(), interval=0.5)

    def evaluate(self, org_id: int, run_id: str) -> list[AlertRecord]:
        self.starts.append(time.monotonic())
        time.sleep(self.cost)
        return []


def test_a_costly_look_spaces_the_next() -> None:
    cheap, costly, too_costly = TimedLooks(0.01), TimedLooks(0.1), TimedLooks(0.4)
    monitors = (cheap, costly, too_costly)
    try:
        ends = time.monotonic() + 6
        while time.monotonic() < ends:  # points keep arriving
            for m in monitors:
                m.touched([(1, "run")])
            time.sleep(0.05)
    finally:
        for m in monitors:
            m.close()
    slack = 0.5  # the loop looks again a quarter second after finding a run not yet due
    gaps = {m.cost: np.diff(m.starts[1:]) for m in monitors}  # after the first look's cost
    assert all(len(g) >= 2 for g in gaps.values()), gaps
    assert all(0.5 <= g <= 0.5 + slack for g in gaps[0.01]), gaps  # the interval
    assert all(0.1 / monitor.LOOK_SHARE <= g <= 1.0 + slack for g in gaps[0.1]), gaps
    assert all(monitor.MAX_GAP <= g <= monitor.MAX_GAP + slack for g in gaps[0.4]), gaps
