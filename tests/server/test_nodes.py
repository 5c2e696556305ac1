"""The ``node`` of rank events: validated, kept per rank (the latest wins), and shown in the
summary (``nodes``, each rank's ``node``, ``order=node``), the stragglers answer and the
export; events without one (the public SDK's) keep working."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from instantml.server.write.idempotency import canonical, canonicals
from instantml.server.write.wire import RankFields
from tests.helpers import rank_body


def _ingest(api: httpx.Client, run_id: str, bodies: list[dict[str, Any]], tag: str) -> None:
    events = [
        {"event_id": f"{run_id}-{tag}-{i}",
         "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body}}
        for i, body in enumerate(bodies)
    ]  # fmt: skip
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200, response.text
    assert {r["status"] for r in response.json()["results"]} == {200}, response.text


def _node(rank: int) -> str | None:
    return None if rank == 6 else ("host-a" if rank < 3 else "host-b")


@pytest.fixture
def on_nodes(api: httpx.Client, run_id: str) -> str:
    bodies = []
    for step in range(40):
        for rank in range(7):
            body = rank_body(step=step, rank=rank, world_size=7,
                             metrics={"loss": 1.0 + (0.5 if rank == 4 else 0.0) + step * 0.001,
                                      "perf/forward_ms": 30.0 if rank >= 3 else 10.0})  # fmt: skip
            if _node(rank) is not None:
                body["node"] = _node(rank)
            bodies.append(body)
    _ingest(api, run_id, bodies, "a")
    return run_id


def test_the_summary_groups_ranks_by_node(api: httpx.Client, on_nodes: str) -> None:
    got = api.get(f"/api/runs/{on_nodes}/distributed", params={"key": "loss"}).json()
    assert {r["rank"]: r["node"] for r in got["ranks"]} == {r: _node(r) for r in range(7)}
    nodes = {n["node"]: n for n in got["nodes"]}
    assert list(nodes) == ["host-a", "host-b", None]  # by name, ranks without one last
    assert nodes["host-a"]["ranks"] == [0, 1, 2] and nodes["host-b"]["ranks"] == [3, 4, 5]
    assert nodes[None]["ranks"] == [6] and nodes["host-b"]["missing_ranks"] == []
    rows = {r["rank"]: r for r in got["ranks"]}
    assert nodes["host-b"]["mean_delta"] == pytest.approx(
        sum(rows[r]["mean_delta"] for r in (3, 4, 5)) / 3
    )
    assert nodes["host-b"]["outlier_steps"] == sum(rows[r]["outlier_steps"] for r in (3, 4, 5))
    # The heatmap by node: the same rows, grouped; each row's node beside it.
    plain = got["heatmap"]
    by_node = api.get(
        f"/api/runs/{on_nodes}/distributed", params={"key": "loss", "order": "node"}
    ).json()["heatmap"]
    assert by_node["nodes"] == ["host-a"] * 3 + ["host-b"] * 3 + [None]
    assert by_node["ranks"] == [0, 1, 2, 3, 4, 5, 6]
    for i, rank in enumerate(by_node["ranks"]):
        assert by_node["values"][i] == plain["values"][plain["ranks"].index(rank)]
    bad = api.get(f"/api/runs/{on_nodes}/distributed", params={"key": "loss", "order": "host"})
    assert bad.status_code == 422 and bad.json()["error"].startswith("order:")


def test_a_nodes_straggler_score_is_its_slowest_ranks(api: httpx.Client, on_nodes: str) -> None:
    got = api.get(f"/api/runs/{on_nodes}/stragglers", params={"key": "perf/forward_ms"}).json()
    nodes = {n["node"]: n for n in got["nodes"]}
    assert nodes["host-a"]["score"] == 1.0 and not nodes["host-a"]["straggler"]
    assert nodes["host-b"]["score"] == pytest.approx(10 / 30) and nodes["host-b"]["straggler"]
    assert nodes["host-b"]["slowest_rank"] == 3
    assert {r["rank"]: r["node"] for r in got["ranks"]} == {r: _node(r) for r in range(7)}


def test_the_latest_node_wins_and_the_export_carries_it(api: httpx.Client, on_nodes: str) -> None:
    moved = rank_body(step=40, rank=1, world_size=7, metrics={"loss": 1.0}, node="host-c")
    _ingest(api, on_nodes, [moved], "b")
    got = api.get(f"/api/runs/{on_nodes}/distributed", params={"key": "loss"}).json()
    assert {r["rank"]: r["node"] for r in got["ranks"]}[1] == "host-c"
    body = api.get(f"/api/runs/{on_nodes}/rank-points", params={"key": "loss"}).json()
    node = body["columns"].index("node")
    assert {p[1]: p[node] for p in body["points"]} == {
        **{r: _node(r) for r in range(7)},
        1: "host-c",
    }


@pytest.mark.parametrize(
    ("node", "why"),
    [("x" * 256, "at most 255"), (5, "must be"), ("a\x00b", "NUL"), ([], "must be")],
)
def test_a_bad_node_is_refused_naming_it(
    api: httpx.Client, run_id: str, node: Any, why: str
) -> None:
    body = rank_body(node=node)
    single = api.post(f"/runs/{run_id}/rank-metrics", json=body)
    assert single.status_code in (400, 422) and "node" in single.json()["error"], single.text
    event = {"event_id": f"{run_id}-bad", "request": {
        "method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body}}  # fmt: skip
    (result,) = api.post("/api/ingest", json={"events": [event]}).json()["results"]
    assert result["status"] in (400, 422) and "node" in result["body"]["error"], result
    assert api.get(f"/api/runs/{run_id}/keys").json()["keys"] == []  # nothing stored


def test_a_key_replays_with_or_without_node_as_sent(api: httpx.Client, run_id: str) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    plain = rank_body(metrics={"loss": 1.0})
    assert api.post(path, json=plain, headers={"Idempotency-Key": f"{run_id}-p"}).status_code == 200
    again = api.post(path, json=plain, headers={"Idempotency-Key": f"{run_id}-p"})
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    other = api.post(path, json={**plain, "node": "h"}, headers={"Idempotency-Key": f"{run_id}-p"})
    assert other.status_code == 422 and "Idempotency-Key" in other.json()["error"]


def test_a_body_without_node_fingerprints_as_before_the_field() -> None:
    """Keys stored before ``node`` existed replay as they did: an absent node is not in
    the canonical form, a given one is."""
    import msgspec

    from instantml.server.write.wire import RankBody

    plain = msgspec.convert(rank_body(metrics={"node": 1.0, "loss": 2.0}), RankBody)
    assert b'"node":null' not in canonical(
        plain
    ) and b'"metrics":{"loss":2.0,"node":1.0}' in canonical(plain)
    given = msgspec.convert(rank_body(node="h"), RankBody)
    assert b'"node":"h"' in canonical(given)


def test_instantml_ranks_shows_nodes(server: Any, on_nodes: str) -> None:
    from tests.helpers import instantml

    env = {"INSTANTML_API_BASE_URL": server.url, "INSTANTML_API_KEY": server.admin_key,
           "COLUMNS": "160"}  # fmt: skip
    out = instantml("ranks", on_nodes, "--key", "loss", env=env)
    assert out.returncode == 0, out.stderr
    assert "Nodes" in out.stdout and "host-a" in out.stdout and "0-2" in out.stdout
    slow = instantml("ranks", on_nodes, "--stragglers", env=env)
    assert slow.returncode == 0, slow.stderr
    assert "slow nodes node host-b" in " ".join(slow.stdout.split())


@given(
    bodies=st.lists(
        st.builds(
            RankFields,
            metrics=st.dictionaries(
                st.sampled_from(["node", '"node":null,', "loss", 'a"b']) | st.text(min_size=1),
                st.floats(allow_nan=False, allow_infinity=False),
                min_size=1,
            ),
            step=st.integers(0, 2**63 - 1),
            rank=st.integers(0, 511),
            world_size=st.integers(1, 512),
            node=st.none() | st.sampled_from(['"node":null,', "n\n1", ""]) | st.text(),
        ),
        max_size=20,
    )
)
def test_a_batchs_canonical_forms_are_each_bodys(bodies: list[RankFields]) -> None:
    """A batch's bodies are encoded in one call and cut apart: the same bytes, body by
    body, as each encoded alone (the fingerprint a key replays against)."""
    assert canonicals(bodies) == [canonical(body) for body in bodies]
