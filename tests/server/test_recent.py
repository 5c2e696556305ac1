"""Summary answers reused for the dashboard's refreshes (server/recent.py): only for a
request that accepts an older answer (``Cache-Control: max-age``), never older than it
allows nor past the budget (``summary_reuse`` x what the answer cost), with its ``Age``;
every other request gets an answer computed for it."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from instantml.server.process import ServerProcess
from instantml.server.recent import RecentAnswers, max_age
from tests.summary.reference import Point
from tests.summary.test_reference import ingest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_reused_within_the_asked_age_and_its_budget() -> None:
    clock = Clock()
    recent = RecentAnswers(reuse=10, clock=clock)
    recent.put("q", b"answer", at=100.0, cost=0.5)  # budget: until 105
    clock.now = 103.0
    assert recent.get("q", max_age=30) == (b"answer", 3.0)
    assert recent.get("q", max_age=2) is None  # older than this request accepts
    assert recent.get("other", max_age=30) is None
    clock.now = 105.5
    assert recent.get("q", max_age=30) is None  # past its budget: recomputed


def test_no_reuse_when_turned_off_and_spent_answers_are_dropped() -> None:
    clock = Clock()
    off = RecentAnswers(reuse=0, clock=clock)
    off.put("q", b"answer", at=100.0, cost=5.0)
    assert len(off) == 0 and off.get("q", max_age=30) is None
    recent = RecentAnswers(reuse=10, entries=2, clock=clock)
    recent.put("a", b"1", at=100.0, cost=0.1)  # spent at 101
    recent.put("b", b"2", at=100.0, cost=1.0)
    clock.now = 102.0
    recent.put("c", b"3", at=102.0, cost=1.0)
    assert len(recent) == 2 and recent.get("a", 30) is None  # dropped when c was kept
    recent.put("d", b"4", at=102.0, cost=1.0)  # over the bound: the least recent goes
    assert recent.get("b", 30) is None and recent.get("c", 30) == (b"3", 0.0)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 0.0),
        ("", 0.0),
        ("max-age=30", 30.0),
        ("Max-Age=5, private", 5.0),
        ("max-age=30, no-cache", 0.0),
        ("no-store", 0.0),
        ("max-age=soon", 0.0),
        ("max-age=-5", 0.0),
        ('max-age="7"', 7.0),
    ],
)
def test_max_age_is_read_from_cache_control(header: str | None, seconds: float) -> None:
    assert max_age(header) == seconds


def _summary(api: httpx.Client, run_id: str, **headers: str) -> httpx.Response:
    answer = api.get(f"/api/runs/{run_id}/distributed", params={"key": "loss"}, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer


def test_a_refresh_may_get_the_last_answer_and_a_request_without_max_age_never(
    start_server: Callable[..., ServerProcess],
) -> None:
    # A budget no test outlasts: what is reused is decided by the request's max-age alone.
    server = start_server(env={"INSTANTML_SUMMARY_REUSE": "1000000"})
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30
    ) as api:
        run_id = ingest(
            api, [Point(s, r, float(s + r), 1.0, r, 4) for s in range(50) for r in range(4)]
        )
        first = _summary(api, run_id, **{"Cache-Control": "max-age=60"})
        assert "age" not in first.headers and first.json()["step_range"] == [0, 49]
        for rank in range(4):
            api.post(
                f"/runs/{run_id}/rank-metrics",
                json={"metrics": {"loss": 1.0}, "step": 50, "rank": rank, "world_size": 4},
            ).raise_for_status()
        reused = _summary(api, run_id, **{"Cache-Control": "max-age=60"})
        assert reused.content == first.content and int(reused.headers["age"]) >= 0
        # Without max-age (the API's clients), or with no-cache: every committed point.
        assert _summary(api, run_id).json()["step_range"] == [0, 50]
        assert _summary(api, run_id, **{"Cache-Control": "no-cache"}).json()["step_range"] == [
            0,
            50,
        ]
        # Other parameters are another question.
        other = api.get(
            f"/api/runs/{run_id}/distributed",
            params={"key": "loss", "heatmap_steps": 10},
            headers={"Cache-Control": "max-age=60"},
        )
        assert "age" not in other.headers and other.json()["step_range"] == [0, 50]
        # The answer kept is never older than a request accepts.
        assert _summary(api, run_id, **{"Cache-Control": "max-age=0"}).json()["step_range"] == [
            0,
            50,
        ]
        time.sleep(1.2)
        newer = _summary(api, run_id, **{"Cache-Control": "max-age=1"})
        assert "age" not in newer.headers and newer.json()["step_range"] == [0, 50]
