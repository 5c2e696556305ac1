"""The run-health detectors' thresholds, shared by the SDK (which checks a run's own at
``init``) and the server: the defaults, the server's (``INSTANTML_HEALTH``, JSON) and a
run's own (``init(..., health={...})``, stored as ``health/<name>`` run attributes), each
layer overriding the one before."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Thresholds:
    enabled: bool = True
    # How long a rank may go without sending anything before being behind counts against
    # it: live, ranks upload at different moments (async batches, a spool uploader's
    # round-robin), so a healthy rank is often a few steps behind for a few seconds.
    lag_seconds: float = 15.0
    # rank_missing: outpaced by this many steps that other ranks reported (and quiet for
    # lag_seconds)...
    missing_steps: int = 3
    # ...or nothing received from it this long while others send.
    silent_seconds: float = 60.0
    # straggler: NVRx-style score below this on a perf/*_ms key over the window of steps,
    # judged only from straggler_min_steps samples of each rank compared and medians at
    # least straggler_min_ms apart.
    straggler_score: float = 0.75
    straggler_window: int = 200
    straggler_min_steps: int = 20
    straggler_min_ms: float = 1.0
    # outlier_burst: |robust_z| >= burst_z in at least burst_steps of a key's last
    # burst_window steps, for one rank.
    burst_z: float = 3.5
    burst_steps: int = 5
    burst_window: int = 10

    def merged(self, values: Mapping[str, Any], where: str) -> Thresholds:
        """These thresholds with ``values`` over them; ValueError names a bad field as
        ``<where>.<name>``."""
        changes = {name: check(name, value, where) for name, value in values.items()}
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f.type for f in dataclasses.fields(Thresholds)}
_INTS = {"missing_steps", "straggler_window", "straggler_min_steps", "burst_steps", "burst_window"}


def check(name: str, value: Any, where: str) -> Any:
    """The value a threshold may take, or ValueError naming ``<where>.<name>``."""
    field = f"{where}.{name}"
    if name not in _FIELDS:
        known = ", ".join(sorted(_FIELDS))
        raise ValueError(f"{field}: unknown health threshold (known: {known})")
    if name == "enabled":
        if type(value) is not bool:
            raise ValueError(f"{field} must be true or false")
        return value
    if type(value) is bool or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number")
    if name in _INTS:
        if value != int(value) or not 1 <= value <= 100_000:
            raise ValueError(f"{field} must be an integer from 1 to 100000")
        return int(value)
    if name == "straggler_score" and not 0 < value <= 1:
        raise ValueError(f"{field} must be in (0, 1]")
    if value <= 0:
        raise ValueError(f"{field} must be > 0")
    return float(value)


def from_env(raw: str | None) -> Thresholds:
    """The server's thresholds from ``INSTANTML_HEALTH`` (a JSON object), else defaults."""
    if raw is None or not raw.strip():
        return Thresholds()
    try:
        values = json.loads(raw)
    except ValueError:
        raise ValueError("INSTANTML_HEALTH must be a JSON object") from None
    if not isinstance(values, dict):
        raise ValueError("INSTANTML_HEALTH must be a JSON object")
    return Thresholds().merged(values, "INSTANTML_HEALTH")
