"""The run-health monitor: a thread that re-evaluates the detectors of every run that got
rank points (told by the write service after each committed unit), at most every
``interval`` seconds per run (longer on a busy server: ``LOOK_SHARE``), from the stores'
committed data; opens an alert for each new finding and resolves the open alerts whose
finding is gone (``HealthStore.change``, which also queues their webhook deliveries).

It never runs in the write path: ingest only adds a run to a set. Reads are bounded: each
rank key's last steps (``window_points``: the steps since the last evaluation, at least
64, at most 4,096), and each timing key's per-rank medians over ``straggler_window``."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, urlencode

from ..rankmath.step_stats import REFERENCE_STEPS
from ..rankmath.stragglers import is_timing_key
from ..storage.health_sql import new_id
from ..storage.protocols import Stores
from ..storage.records import RANK, AlertRecord, RunRecord
from ..thresholds import Thresholds, check
from . import detectors
from .detectors import Finding, KeyWindow

log = logging.getLogger(__name__)

MIN_WINDOW, MAX_WINDOW = 64, 4096
# A run with more rank keys is read this many at a time, in turn (timing keys always), so
# that a run logging 10,000 keys costs a look what one logging 64 does.
KEYS_PER_LOOK = 64
# A run's looks take at most this share of the wall time (a look that took 0.1 s waits
# 1 s for the next), but are never further apart than MAX_GAP: under heavy ingest the
# monitor yields to the writer, and an alert still comes within about two seconds.
LOOK_SHARE, MAX_GAP = 0.1, 1.5
ATTRIBUTE_TYPE, ATTRIBUTE_PREFIX = "health", "health/"  # as server/write/validate.py checks them
MOVING = frozenset(
    {"rank_missing", "node_missing", "non_finite"}
)  # kinds whose since_step follows the points


def alert_url(base: str, alert: AlertRecord) -> str:
    """The dashboard's Distributed tab at the alert's key and step, from ``base`` (the
    server's public address)."""
    query: dict[str, str | int] = {"key": alert.key} if alert.key else {}
    query.update(step_min=max(0, alert.since_step - 50), step_max=alert.since_step + 50)
    where = f"#/runs/{quote(alert.run_id, safe='')}/distributed?{urlencode(query)}"
    return f"{base.rstrip('/')}/{where}"


def webhook_body(alert: AlertRecord, run: RunRecord, base: str) -> dict[str, Any]:
    """What a webhook is posted: Slack's ``text``, the alert as the health API gives it,
    and the run with the dashboard link to the alert's rank and step."""
    where = f"{run.project}/{run.name or run.run_id}"
    url = alert_url(base, alert)
    return {
        "text": f":rotating_light: InstantML run {where}: {alert.kind} - {alert.message} <{url}>",
        "alert": alert.to_json(),
        "run": {"id": run.run_id, "project": run.project, "name": run.name, "url": url},
    }


def _alert(org_id: int, run_id: str, finding: Finding, now: float) -> AlertRecord:
    f = finding
    return AlertRecord(
        new_id("alr"), org_id, run_id, f.kind, f.rank, f.key, f.since_step, f.since_time,
        f.message, now,
    )  # fmt: skip


class HealthMonitor:
    def __init__(
        self,
        stores: Stores,
        thresholds: Thresholds,
        on_opened: Callable[[], None] | None = None,
        interval: float = 0.5,
        clock: Callable[[], float] = time.time,
        pause: Callable[[], None] | None = None,
        public_url: str = "http://127.0.0.1:8765",
    ) -> None:
        self._stores = stores
        self._public_url = public_url
        # Called before each look's reads (the server's: wait, bounded, for the writes in
        # flight; reads yield to writes).
        self._pause = pause
        self._thresholds = thresholds
        self._on_opened = on_opened
        self._interval = interval
        self._clock = clock
        self._dirty: set[tuple[int, str]] = set()
        self._nonfinite: set[tuple[int, str]] = set()  # runs given a non-finite value since
        # (run, rank, last step) -> the first step after it (a rank behind the windows).
        self._next_after: dict[tuple[int, str, int | None], int | None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_eval: dict[tuple[int, str], float] = {}
        self._cost: dict[tuple[int, str], float] = {}  # the wall time of each run's last look
        self._last_step: dict[tuple[int, str], int] = {}
        self._known_last: dict[tuple[int, str], dict[int, int]] = {}
        self._turn: dict[tuple[int, str], int] = {}  # where the next look at many keys starts
        # Keys not read since the run's latest step last moved: the run is looked at again
        # until none are left, though no more points come (its last ones may hold a burst).
        self._unread: dict[tuple[int, str], int] = {}
        # Runs with a rank that is behind but not yet quiet for lag_seconds: looked at
        # again though no points come (the others may have ended).
        self._waiting: set[tuple[int, str]] = set()
        self._thread = threading.Thread(target=self._run, name="instantml-health", daemon=True)
        self._thread.start()

    def touched(
        self, runs: Iterable[tuple[int, str]], nonfinite: Iterable[tuple[int, str]] = ()
    ) -> None:
        """These runs got points, these non-finite ones (called by the writer thread:
        cheap)."""
        with self._lock:
            self._dirty.update(runs)
            self._nonfinite.update(nonfinite)
        self._wake.set()

    def forget(self, org_id: int, run_id: str) -> None:
        """A deleted run: nothing of it kept (its id may name a new run)."""
        run = (org_id, run_id)
        with self._lock:
            for members in (self._dirty, self._nonfinite, self._waiting):
                members.discard(run)
            for index in (self._last_eval, self._cost, self._last_step, self._known_last,
                          self._turn, self._unread):  # fmt: skip
                index.pop(run, None)
            for slot in [slot for slot in self._next_after if slot[:2] == run]:
                del self._next_after[slot]

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                due = {r for r in self._dirty if now - self._last_eval.get(r, -1e9) >= self._gap(r)}
                self._dirty -= due
                later = bool(self._dirty)
            for run in sorted(due):
                self._last_eval[run] = now
                try:
                    self.evaluate(*run)
                except Exception:  # a store away for now: the run is tried again later
                    log.exception("evaluating the health of run %s", run[1])
                    with self._lock:
                        self._dirty.add(run)
                if self._unread.get(run, 0) > 0 or run in self._waiting:
                    with self._lock:
                        self._dirty.add(run)
                self._cost[run] = time.monotonic() - now
                now = time.monotonic()
            if later:  # runs evaluated too recently: look again when they are due
                self._stop.wait(self._interval / 2)
                self._wake.set()

    def _gap(self, run: tuple[int, str]) -> float:
        """How long after a look at the run the next may start: ``interval``, or longer
        when a look takes more than ``LOOK_SHARE`` of that (a busy server: the looks wait
        on the writer and the readers for the GIL and the store), up to ``MAX_GAP``."""
        return min(MAX_GAP, max(self._interval, self._cost.get(run, 0.0) / LOOK_SHARE))

    def thresholds(self, org_id: int, run_id: str) -> Thresholds:
        """The server's thresholds with the run's own (its ``health/*`` attributes) over."""
        rows = self._stores.runs.attributes_of(org_id, run_id, [ATTRIBUTE_TYPE], ATTRIBUTE_PREFIX)
        own: dict[str, Any] = {}
        for _, path, _, value in rows:
            name = path[len(ATTRIBUTE_PREFIX) :]
            try:
                own[name] = check(name, value, "health")
            except ValueError as exc:  # refused at write; kept out here all the same
                log.warning("run %s: %s", run_id, exc)
        return self._thresholds.merged(own, "health") if own else self._thresholds

    def evaluate(self, org_id: int, run_id: str) -> list[AlertRecord]:
        """Run the detectors on the run now; open and resolve its alerts. Returns the
        alerts opened."""
        stores = self._stores
        run = stores.runs.get_run(org_id, run_id)
        series = stores.runs.series(org_id, run_id)
        if run is None or series is None:
            return []
        th = self.thresholds(org_id, run_id)
        ident = (org_id, run_id)
        findings: list[Finding] = []
        looked: set[str] | None = None  # the keys read this time (None: every key)
        now = self._clock()
        if th.enabled:
            findings, looked = self._findings(ident, run, series, th, now)
        open_alerts = stores.health.alerts(org_id, run_id, open_only=True)
        held = {alert.ident: alert for alert in open_alerts}
        found = {finding.ident for finding in findings}
        new = [_alert(org_id, run_id, f, now) for f in findings if f.ident not in held]
        # An open alert whose first step is read from the stored points follows them (late
        # points move it); a burst or a straggler keeps the step it opened at.
        moved = [
            dataclasses.replace(
                held[f.ident], since_step=f.since_step, since_time=f.since_time, message=f.message
            )
            for f in findings
            if f.kind in MOVING and f.ident in held and held[f.ident].since_step != f.since_step
        ]
        gone = [
            alert.alert_id
            for alert in open_alerts
            if alert.ident not in found
            and alert.kind != "non_finite"  # a value that was stored stays so
            and (looked is None or alert.key in looked or not alert.key)
        ]
        if not new and not gone and not moved:
            return []
        base = self._public_url
        opened = stores.health.change(
            new, gone, now, lambda alert: webhook_body(alert, run, base), moved
        )
        if opened and self._on_opened is not None:
            self._on_opened()
        return opened

    def _findings(
        self,
        ident: tuple[int, str],
        run: RunRecord,
        series: list[tuple[int, int, str]],
        th: Thresholds,
        now: float,
    ) -> tuple[list[Finding], set[str] | None]:
        latest = run.last_step or 0
        since_last = latest - self._last_step.get(ident, latest)
        # The burst window's steps with REFERENCE_STEPS before them: robust_z's reference.
        least = max(MIN_WINDOW, REFERENCE_STEPS + th.burst_window + th.missing_steps)
        span = min(MAX_WINDOW, max(least, since_last + th.missing_steps + th.burst_window))
        span = -(-span // MIN_WINDOW) * MIN_WINDOW  # a few sizes: a store keeps each's floor
        points = self._stores.points
        windows = []
        findings: list[Finding] = []
        ranked = [(sid, key) for sid, kind, key in series if kind == RANK]
        looked: set[str] | None = None
        if len(ranked) > KEYS_PER_LOOK:
            timing = [(sid, key) for sid, key in ranked if is_timing_key(key)]
            others = [(sid, key) for sid, key in ranked if not is_timing_key(key)]
            start = self._turn.get(ident, 0) % len(others)
            turn = (others[start:] + others[:start])[: max(0, KEYS_PER_LOOK - len(timing))]
            self._turn[ident] = start + len(turn)
            if latest != self._last_step.get(ident):
                self._unread[ident] = len(others)
            left = self._unread.get(ident, len(others)) - len(turn)
            self._unread[ident] = left if turn else 0  # (64 timing keys: the others unread)
            ranked = timing + turn
            looked = {key for _, key in ranked}
        if self._pause is not None and ranked:
            self._pause()
        with self._lock:
            flagged = ident in self._nonfinite
            self._nonfinite.discard(ident)
        held = self._stores.health.alerts(*ident, open_only=True)
        alerted = {(a.rank, a.key) for a in held if a.kind == "non_finite"}
        missing = {a.rank for a in held if a.kind == "rank_missing"}
        for sid, key in ranked:
            columns = points.window_points(sid, span)
            window = KeyWindow(key, **columns)
            windows.append(window)
            findings += detectors.outlier_bursts(window, th)
            fresh = {r for r in detectors.nonfinite_ranks(window) if (r, key) not in alerted}
            # Each rank's first non-finite value is looked up where it is stored when one
            # came (a late upload lands before the window) or the window shows a new one.
            if flagged or fresh:
                findings += detectors.non_finite(window, points.first_nonfinite(sid), now)
            if is_timing_key(key):
                steps, medians = points.window_medians(sid, th.straggler_window)
                findings += detectors.stragglers(key, steps, medians, th, now)
        activity = self._stores.runs.rank_activity(*ident)
        known = self._known_last.setdefault(ident, {})
        in_windows = detectors.last_steps(windows)
        absent = [r for r in activity if r not in in_windows and r not in known]
        if absent and ranked:  # e.g. after a restart: where they were last seen
            for sid, _ in ranked:
                for rank, step in points.last_steps_of(sid, absent).items():
                    known[rank] = max(step, known.get(rank, -1))
        sids = [sid for sid, _ in ranked]
        waiting: set[int] = set()
        # A node's alert holds its ranks missing as a rank's alert holds the rank.
        nodes = detectors.node_of(activity)
        for alert in held:
            if alert.kind == "node_missing":
                mine = activity.get(alert.rank)
                missing.update(nodes.get(mine.node, []) if mine and mine.node else [alert.rank])
        lost = detectors.rank_missing(
            windows, th, now, activity, known, lambda seen: self._first_after(ident, sids, seen),
            waiting, frozenset(missing),
        )  # fmt: skip
        world = max((int(w.world_size.max()) for w in windows if len(w.world_size)), default=0)
        findings += detectors.node_missing(lost, waiting, activity, world)
        if waiting:
            self._waiting.add(ident)
        else:
            self._waiting.discard(ident)
        for rank, step in in_windows.items():
            if step > known.get(rank, -1):
                known[rank] = step
        self._last_step[ident] = latest
        return findings, looked

    def _first_after(self, ident: tuple[int, str], sids: list[int], seen: int | None) -> int | None:
        """The first step after ``seen`` at which any rank reported any of these keys."""
        slot = (*ident, seen)
        if slot not in self._next_after:
            if len(self._next_after) > 65_536:
                self._next_after.clear()
            found = [self._stores.points.next_step(sid, seen) for sid in sids]
            self._next_after[slot] = min((f for f in found if f is not None), default=None)
        return self._next_after[slot]
