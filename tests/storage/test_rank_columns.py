"""An ingest batch decided at once (its events as columns) leaves the stores exactly as its
events decided one by one would: same answers, same points, same reducers and scores, same
usage. Read back through the protocols, on every backend.

Randomized groups mix new points, rewrites of committed and of staged points, replays, a
key reused with another body, an unknown run and a monthly limit within reach; the stores
are closed and reopened between groups, so what a backend keeps in memory (each rank's
newest step, the key filter) is rebuilt from disk in between."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from instantml.rankmath.params import SummaryParams
from instantml.server.write.answers import Answer
from instantml.server.write.commands import CreateRun, Envelope, MetricMatrix, RankEvents
from instantml.server.write.guardrail import UsagePolicy, month_of
from instantml.server.write.service import WriteService
from instantml.storage import open_stores
from instantml.storage.protocols import Stores
from instantml.storage.records import RANK
from tests.engines import Engines
from tests.helpers import store_rank_rows
from tests.storage.conftest import BACKENDS, examples

WORLD = 6
NOW = 1_800_000_000.0


@st.composite
def groups(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    result = []
    next_id = 0
    for _ in range(draw(st.integers(1, 4))):
        group = []
        # A plain group (every run known, every key new) is decided at once; a mixed one
        # event by event. Both must end the same.
        mixed = draw(st.booleans())
        # One set of keys for every event (their values then travel as a MetricMatrix),
        # or keys drawn per event (a list of dicts).
        shared = draw(st.sampled_from([None, ("a",), ("a", "b")]))
        for _ in range(draw(st.integers(1, 30))):
            if mixed and next_id and draw(st.integers(0, 9)) == 0:
                event_id = draw(st.integers(0, next_id - 1))  # a replay, or a reuse
            else:
                event_id, next_id = next_id, next_id + 1
            keys = shared or draw(st.sampled_from([("a",), ("a", "b"), ("b", "a")]))
            group.append(
                {
                    "id": event_id,
                    "run": draw(st.sampled_from(["r", "r", "r", "nope"])) if mixed else "r",
                    "step": draw(st.integers(0, 6)),
                    "rank": draw(st.integers(0, WORLD - 1)),
                    "metrics": {
                        k: draw(st.sampled_from([0.5, 1.0, 2.0, -3.25, 7.0, math.nan]))
                        for k in keys
                    },
                    "weight": draw(st.sampled_from([1.0, 2.0, 64.0])),
                    "local": draw(st.sampled_from([-1, 0, 1])),
                }
            )
        result.append(group)
    return result


def _write(org: int, events: list[dict[str, Any]]) -> RankEvents:
    return RankEvents(
        org_id=org,
        run_ids=[e["run"] for e in events],
        steps=[e["step"] for e in events],
        ranks=[e["rank"] for e in events],
        world_sizes=[WORLD] * len(events),
        local_ranks=[e["local"] for e in events],
        weights=[e["weight"] for e in events],
        timestamps=[1.0] * len(events),
        nodes=[None] * len(events),
        metrics=MetricMatrix.of([e["metrics"] for e in events]) or [e["metrics"] for e in events],
        key_hi=np.array([e["id"] for e in events], dtype=np.int64),
        key_lo=np.full(len(events), 7, dtype=np.int64),
        # Same key, another body: its fingerprint differs, so the answer must be 422.
        fingerprints=np.array(
            [hash((e["step"], e["rank"], tuple(map(repr, e["metrics"].items())))) for e in events],
            dtype=np.int64,
        ),
        key_seq=np.zeros(len(events), dtype=np.int64),
        key_n=np.full(len(events), -1, dtype=np.int64),
    )


def _answers(outcomes: list[Answer]) -> list[tuple[int, Any, bool]]:
    flat: list[Answer] = []
    for outcome in outcomes:
        flat.extend(outcome.each if outcome.each is not None else [outcome])
    return [(o.status, o.body, o.replayed) for o in flat]


def _contents(stores: Stores, org: int) -> dict[str, Any]:
    """What the stores hold, read through the protocols."""
    found: dict[str, Any] = {"usage": stores.ledger.used(org, month_of(NOW))}
    everything = SummaryParams(z=1e-9, outlier_limit=10_000)  # every row with a score
    for key in ("a", "b"):
        sid = stores.runs.series_id(org, "r", RANK, key)
        if sid is None:
            continue
        rows = stores.points.summary_rows(sid, everything)
        found[key] = {
            "points": [tuple(map(_nan, p)) for p in store_rank_rows(stores, sid)],
            "band": {name: [_nan(v) for v in col.tolist()] for name, col in rows.band.items()},
            "rollup": [tuple(map(_nan, r)) for r in rows.rollup],
            "outliers": sorted(tuple(map(_nan, o)) for o in rows.outliers),
        }
    return found


def _nan(value: Any) -> Any:
    return "nan" if isinstance(value, float) and value != value else value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _applied(
    engines: Engines,
    root: Path,
    backend: str,
    groups: list[list[dict[str, Any]]],
    whole: bool,
    limit: int | None,
) -> tuple[list[Any], dict[str, Any]]:
    metadata_url, points_url = BACKENDS[backend](engines, root)
    answers: list[Any] = []
    policy = UsagePolicy(default_limit=limit, clock=lambda: NOW)
    for group in groups:
        stores = open_stores(metadata_url, points_url)
        service = WriteService(stores, policy)
        org, _ = stores.tenancy.ensure_org("o")
        service.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])
        write = _write(org, group)
        answers += _answers(service.apply([Envelope(write)] if whole else write.envelopes()))
        stores.close()
    stores = open_stores(metadata_url, points_url)
    service = WriteService(stores, policy)
    org, _ = stores.tenancy.ensure_org("o")
    series = [stores.runs.series_id(org, "r", RANK, key) for key in ("a", "b")]
    service.compact(sid for sid in series if sid is not None)
    contents = _contents(stores, org)
    stores.close()
    return answers, contents


def test_columns_apply_as_their_events_would(
    tmp_path_factory: Any, engines: Engines, backend: str
) -> None:
    # The columns and the events meet the same write code on every backend: the embedded
    # default draws the most examples, the others enough to check their stores' own writes.
    @examples(backend, 30 if backend == "duckdb" else 10)
    @given(groups=groups(), limit=st.sampled_from([None, None, 40]))
    def check(groups: list[list[dict[str, Any]]], limit: int | None) -> None:
        mktemp = tmp_path_factory.mktemp
        whole = _applied(engines, Path(mktemp("whole")), backend, groups, True, limit)
        events = _applied(engines, Path(mktemp("events")), backend, groups, False, limit)
        assert _same(whole[0], events[0])
        assert _same(whole[1], events[1])
        for key in ("a", "b"):
            points = whole[1].get(key, {}).get("points", [])
            assert len({(s, r) for s, r, *_ in points}) == len(points)  # one row per point

    check()
