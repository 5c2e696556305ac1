"""A RankEvents write (the columns an ingest batch becomes) leaves the store exactly as its
events applied one by one would: same answers, same points, same reducers and scores.

Randomized groups mix new points, rewrites of committed and of staged points, replays,
a key reused with another body, an unknown run and a monthly limit within reach; the
store is closed and reopened between groups, so what it keeps in memory (each rank's
newest step, the key filter) is rebuilt from disk in between."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instantml.storage import UsagePolicy
from instantml.storage.base import CreateRun, Envelope, Outcome, RankEvents, Refresh
from instantml.storage.duckdb_store import DuckDBStore

WORLD = 6


@st.composite
def groups(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    result = []
    next_id = 0
    for _ in range(draw(st.integers(1, 4))):
        group = []
        # A plain group (every run known, every key new) is staged as columns; a mixed one
        # falls back to event by event. Both must end the same.
        mixed = draw(st.booleans())
        for _ in range(draw(st.integers(1, 30))):
            if mixed and next_id and draw(st.integers(0, 9)) == 0:
                event_id = draw(st.integers(0, next_id - 1))  # a replay, or a reuse
            else:
                event_id, next_id = next_id, next_id + 1
            keys = draw(st.sampled_from([("a",), ("a", "b"), ("b", "a")]))
            group.append(
                {
                    "id": event_id,
                    "run": draw(st.sampled_from(["r", "r", "r", "nope"])) if mixed else "r",
                    "step": draw(st.integers(0, 6)),
                    "rank": draw(st.integers(0, WORLD - 1)),
                    "metrics": {
                        k: draw(st.sampled_from([0.5, 1.0, 2.0, -3.25, 7.0])) for k in keys
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
        metrics=[e["metrics"] for e in events],
        key_hi=[e["id"] for e in events],
        key_lo=[7] * len(events),
        # Same key, another body: its fingerprint differs, so the store must answer 422.
        fingerprints=[hash((e["step"], e["rank"], tuple(e["metrics"].items()))) for e in events],
    )


def _answers(outcomes: list[Outcome]) -> list[tuple[int, Any, bool]]:
    flat: list[Outcome] = []
    for outcome in outcomes:
        flat.extend(outcome.each if outcome.each is not None else [outcome])
    return [(o.status, o.body, o.replayed) for o in flat]


def _contents(store: DuckDBStore) -> dict[str, Any]:
    con = store._con
    points = con.execute(
        "SELECT s.key, p.step, p.rank, p.value, p.weight, p.local_rank, p.delta, p.z, p.robust_z"
        " FROM rank_points p JOIN series s USING (series_id) ORDER BY 1, 2, 3"
    ).fetchall()
    stats = con.execute(
        "SELECT s.key, t.* EXCLUDE (series_id) FROM step_stats t JOIN series s USING (series_id)"
        " ORDER BY 1, 2"
    ).fetchall()
    usage = con.execute("SELECT sum(points) FROM usage_log").fetchall()
    return {"points": points, "stats": stats, "usage": usage}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(groups=groups(), limit=st.sampled_from([None, None, 40]))
def test_columns_apply_as_their_events_would(
    tmp_path_factory: Any, groups: list[list[dict[str, Any]]], limit: int | None
) -> None:
    root = Path(tmp_path_factory.mktemp("stores"))
    paths = {"columns": str(root / "columns.duckdb"), "events": str(root / "events.duckdb")}
    answers: dict[str, list[Any]] = {"columns": [], "events": []}
    for name, path in paths.items():
        for group in groups:
            store = DuckDBStore(path, UsagePolicy(default_limit=limit))
            org = store.ensure_org("o")
            store.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])
            write = _write(org, group)
            envelopes = [Envelope(write)] if name == "columns" else write.envelopes()
            answers[name] += _answers(store.apply(envelopes))
            store.close()
        store = DuckDBStore(path, UsagePolicy(default_limit=limit))
        for key in ("a", "b"):
            store.apply([Envelope(Refresh(store.ensure_org("o"), "r", key))])
        answers[name].append(_contents(store))
        store.close()
    assert _same(answers["columns"][:-1], answers["events"][:-1])
    got, want = answers["columns"][-1], answers["events"][-1]
    for part in ("points", "stats", "usage"):
        assert _same(got[part], want[part]), part
    points = got["points"]
    assert len({(k, s, r) for k, s, r, *_ in points}) == len(points)  # one row per point
