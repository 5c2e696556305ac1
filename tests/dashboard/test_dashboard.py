"""The dashboard in a real browser: from the sign-in link to the Distributed tab by clicking."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.dashboard.conftest import shot, wait_until
from tests.summary.reference import Point
from tests.summary.test_reference import ingest

XSS_KEY = "<img src=x onerror=window.__xss=1>"


@pytest.fixture
def known_run(api: httpx.Client) -> dict[str, Any]:
    """8 ranks x 40 steps: rank 5 stops after step 25, rank 2 spikes, rank 7 weighs 1000x."""
    writes = [
        Point(
            s,
            r,
            (50.0 if (r == 2 and s % 10 == 3) else 1.0 + 0.01 * r),
            1000.0 if r == 7 else 1.0,
            r % 4,
            8,
        )
        for s in range(40)
        for r in range(8)
        if not (r == 5 and s > 25)
    ]
    name = f"<script>window.__xss=2</script> dash-{uuid.uuid4().hex[:6]}"
    run_id = ingest(api, writes, name=name)
    events = [
        {
            "event_id": f"{run_id}-x{i}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {"metrics": {XSS_KEY: 1.0}, "step": i, "rank": 0, "world_size": 8},
            },
        }
        for i in range(3)
    ]
    api.post("/api/ingest", json={"events": events}).raise_for_status()
    api.post(
        f"/api/runs/{run_id}/attributes",
        json={
            "attributes": [{"path": "config/<b>html</b>", "type": "config", "value": "<i>text</i>"}]
        },
    ).raise_for_status()
    api.patch(f"/runs/{run_id}", json={"status": "finished"}).raise_for_status()
    return {"id": run_id, "name": name}


def test_sign_in_link_to_distributed_tab(
    page: Any, server: ServerProcess, known_run: dict[str, Any]
) -> None:
    page.goto(f"{server.url}/?token={server.admin_key}")
    page.wait_for_selector("main[data-ready=runs]")
    assert "token" not in page.url  # the key is kept, and dropped from the address bar
    assert page.inner_text(f"a.run-link[href='#/runs/{known_run['id']}']") == known_run["name"]
    assert page.evaluate("localStorage.getItem('instantml-api-key')") == server.admin_key
    shot(page, "runs")
    page.click(f"a.run-link[href='#/runs/{known_run['id']}']")
    page.wait_for_selector("main[data-ready=overview]")
    assert "<i>text</i>" in page.inner_text("#config")  # config shown as text
    page.click("#tab-distributed")
    # A loss-like key first, not the first in sorted order (the hostile one).
    page.wait_for_selector("main[data-ready=distributed][data-key=loss]")
    assert page.eval_on_selector("#key-select", "e => e.value") == "loss"
    shot(page, "distributed")

    # Coverage: the missing rank, named with the step it vanished.
    assert page.inner_text("#missing") == "rank 5 last seen at step 25, missing from step 26"
    # The outlier rank first in the outlier table.
    first = page.query_selector_all("#outliers tbody tr")[0].query_selector_all("td")
    assert first[1].inner_text() == "2"
    # The weighted mean line apart from the mean (rank 7 weighs 1000x).
    traces = page.evaluate("document.getElementById('band').data.map(t => [t.name, t.y])")
    lines = {name: y for name, y in traces}
    assert lines["mean"][0] == pytest.approx(sum(1.0 + 0.01 * r for r in range(8)) / 8)
    assert lines["weighted mean"][0] == pytest.approx(
        (sum(1.0 + 0.01 * r for r in range(7)) + 1000 * 1.07) / 1007
    )
    # The per-rank table and the heatmap.
    assert len(page.query_selector_all("#ranks tbody tr")) == 8
    assert page.evaluate("document.getElementById('heatmap').data[0].z.length") == 8
    # Sortable outliers: click "step" twice for descending.
    header = page.query_selector_all("#outliers th")[0]
    header.click()
    header.click()
    steps = [
        int(r.query_selector("td").inner_text())
        for r in page.query_selector_all("#outliers tbody tr")
    ]
    assert steps == sorted(steps, reverse=True)
    assert page.errors == []


def test_untrusted_key_and_name_render_as_text(
    page: Any, server: ServerProcess, known_run: dict[str, Any]
) -> None:
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{known_run['id']}/distributed")
    page.wait_for_selector("main[data-ready=distributed]")
    page.select_option("#key-select", "loss")
    page.wait_for_selector("main[data-ready=distributed][data-key=loss]")
    page.select_option("#key-select", XSS_KEY)
    wait_until(page, f"document.querySelector('main').dataset.key === {XSS_KEY!r}")
    shot(page, "untrusted-key")
    options = page.eval_on_selector_all("#key-select option", "os => os.map(o => o.textContent)")
    assert XSS_KEY in options
    assert page.evaluate("window.__xss") is None
    assert page.inner_text("main h2") == known_run["name"]
    assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert page.errors == []


def test_zoom_in_the_url_refetches_at_full_resolution(
    page: Any, server: ServerProcess, known_run: dict[str, Any]
) -> None:
    page.goto(
        f"{server.url}/?token={server.admin_key}#/runs/{known_run['id']}/distributed?key=loss&step_min=10&step_max=20"
    )
    page.wait_for_selector("main[data-ready=distributed]")
    assert page.inner_text("#range").startswith("steps 10\u201320")
    assert page.evaluate("document.getElementById('band').data[0].x.length") == 11
    page.click("#reset-zoom")
    wait_until(page, "document.querySelector('#range')?.textContent.startsWith('steps 0\u201339')")
    assert "step_min" not in page.url
    assert page.errors == []


def test_heatmap_columns_span_their_block_aligned_buckets(
    page: Any, server: ServerProcess, api: httpx.Client
) -> None:
    # Steps 10-1009 in 200 heatmap columns at most: buckets of 16 steps (the smallest
    # block size of at least 5) from step 0, so the first ([10, 15]) and the last
    # ([1008, 1009]) are partial; rank 1 is high in bucket [496, 511] only.
    writes = [
        Point(s, r, 9.0 if (r == 1 and 496 <= s <= 511) else 1.0, 1.0, r, 4)
        for s in range(10, 1010)
        for r in range(4)
    ]
    run_id = ingest(api, writes)
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed?key=loss")
    page.wait_for_selector("main[data-ready=distributed][data-key=loss]")
    assert "4 steps per point" in page.inner_text("#range")  # the band: 1,000 steps / 500
    edges = page.evaluate("document.getElementById('heatmap').data[0].x")
    assert edges == [10, *range(16, 1009, 16), 1010]  # 64 columns: 65 edges
    z = page.evaluate("document.getElementById('heatmap').data[0].z")
    assert len(z) == 4 and all(len(row) == 64 for row in z)
    high = [j for j, v in enumerate(z[1]) if v == 9.0]
    assert high == [31] and (edges[31], edges[32]) == (496, 512)
    band = page.evaluate("document.getElementById('band').data[5].x")
    assert band[:3] == [10, 12, 16] and band[-1] == 1008  # the band's buckets of 4, aligned too
    assert page.errors == []


def test_login_form(page: Any, server: ServerProcess) -> None:
    page.goto(server.url)
    page.fill("#key", "iml_000000000000_wrong")
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('not accepted')")
    page.fill("#key", server.admin_key)
    page.click("#login button")
    page.wait_for_selector("main[data-ready=runs]")
    assert page.query_selector("#project-filter") is not None
    assert all("401" in e for e in page.errors)  # the refused key's request, nothing else


def test_nonfinite_cells_and_the_outlier_count(
    page: Any, server: ServerProcess, api: httpx.Client
) -> None:
    # 8 ranks x 150 steps; rank 6 spikes at every step (150 outlier rows, 100 shown), rank 3
    # goes NaN from step 120 on, and sends +inf at step 40.
    def value(s: int, r: int) -> float:
        if r == 3 and s >= 120:
            return float("nan")
        if (r, s) == (3, 40):
            return float("inf")
        return 40.0 if r == 6 else 1.0 + 0.01 * r

    writes = [Point(s, r, value(s, r), 1.0, r, 8) for s in range(150) for r in range(8)]
    run_id = ingest(api, writes)
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed?key=loss")
    page.wait_for_selector("main[data-ready=distributed][data-key=loss]")
    shot(page, "nonfinite")
    callout = page.inner_text("#first-nonfinite")
    assert "rank 3 at step 40 (inf)" in callout and "31 non-finite values" in callout
    assert page.inner_text("#outliers-title").startswith("Outliers (100 of 150;")
    names = page.evaluate("document.getElementById('heatmap').data.map(t => t.name || '')")
    assert names[-1] == "non-finite"
    marked = page.evaluate(
        "document.getElementById('heatmap').data[1].z.map(row => row.filter(v => v === 1).length)"
    )
    ranks = page.evaluate("document.getElementById('heatmap').data[1].y")
    assert ranks[3] == "3" and marked[3] == 31 and sum(marked) == 31  # 150 steps, 1 per bucket
    # Coverage counts the NaN rank as reporting: every step full.
    coverage = page.evaluate("document.getElementById('coverage').data[0].y")
    assert set(coverage) == {1}
    rows = page.query_selector_all("#ranks tbody tr")
    row = next(r for r in rows if r.query_selector("td").inner_text() == "3")
    assert row.query_selector_all("td")[-1].inner_text() == "31"
    assert page.errors == []


def test_the_straggler_panel_names_the_rank(
    page: Any, server: ServerProcess, api: httpx.Client
) -> None:
    writes = [
        Point(s, r, (30.0 if r == 6 else 10.0) + 0.01 * s, 1.0, r, 8)
        for s in range(50)
        for r in range(8)
    ]
    run_id = ingest(api, writes, key="perf/forward_ms")
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed")
    page.wait_for_selector("main[data-ready=distributed]")
    verdict = page.inner_text("#straggler-verdict")
    assert verdict.startswith("rank 6 is 2.9") and "the fastest rank's median" in verdict
    first = page.query_selector_all("#stragglers tbody tr")[0].query_selector_all("td")
    assert first[0].inner_text() == "6"
    assert page.errors == []


def test_the_upload_health_panel(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    # The public SDK's async uploader reports itself as system/instantml/* scalars at step =
    # unix time: a small panel with the latest report, a warning when it falls behind, and
    # no chart of each series among the run's own scalars.
    run_id = f"health-{uuid.uuid4().hex[:6]}"
    api.post("/runs", json={"project": "dash", "id": run_id}).raise_for_status()
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/acc": 0.5}, "step": 3})
    reports = [
        (1764547200.25, {"upload_lag_seconds": 0.5, "queued_events": 2.0, "failed_events": 0.0}),
        (1764547205.5, {"upload_lag_seconds": 75.0, "queued_events": 40.0, "failed_events": 3.0}),
    ]
    for step, values in reports:
        metrics = {f"system/instantml/{k}": v for k, v in values.items()}
        response = api.post(f"/runs/{run_id}/metrics", json={"metrics": metrics, "step": step})
        assert response.json() == {"accepted": 3}, response.text
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}")
    page.wait_for_selector("main[data-ready=overview]")
    shot(page, "upload-health")
    assert page.inner_text("#upload-health tr[data-health=queued_events] td.num") == "40"
    assert page.inner_text("#upload-health tr[data-health=upload_lag_seconds] td.num") == "75 s"
    problems = page.inner_text("#upload-problems")
    assert "3 event(s) failed to upload" in problems and "75 s behind" in problems
    assert "2025-12-01 00:00:05 UTC" in page.inner_text("#upload-health")
    titles = [h.inner_text() for h in page.query_selector_all(".grid2 h3")]
    assert titles == []  # eval/acc, logged once, is a value
    assert "eval/acc" in page.inner_text("#single-values")
    assert "last step 3" in page.inner_text("main")  # the reports' unix times are not steps
    assert page.errors == []


def test_console_lines_on_the_run_page(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    run_id = f"console-{uuid.uuid4().hex[:6]}"
    api.post("/runs", json={"project": "dash", "id": run_id}).raise_for_status()
    lines = [
        {"line_number": i, "message": f"epoch {i} <b>done</b>", "timestamp": None} for i in range(3)
    ]
    api.post(
        f"/api/runs/{run_id}/logs", json={"stream": "stdout", "lines": lines}
    ).raise_for_status()
    api.post(
        f"/api/runs/{run_id}/logs",
        json={"stream": "stderr", "lines": [{"line_number": 0, "message": "warning: slow rank"}]},
    ).raise_for_status()
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}")
    page.wait_for_selector("main[data-ready=overview]")
    shot(page, "console")
    assert page.inner_text("#console .muted") == "4 lines"
    shown = [d.inner_text() for d in page.query_selector_all("#console pre div")]
    assert shown == [
        "epoch 0 <b>done</b>",
        "epoch 1 <b>done</b>",
        "epoch 2 <b>done</b>",
        "warning: slow rank",
    ]
    assert page.query_selector("#console pre div.stderr").inner_text() == "warning: slow rank"
    assert page.errors == []


def test_the_health_badge_and_banner(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    # Rank 4 stops after step 29: a rank_missing alert (critical) from step 30.
    writes = [Point(s, r, 1.0 + 0.01 * r, 1.0, r, 8) for s in range(40) for r in range(8)
              if r != 4 or s < 30]  # fmt: skip
    run_id = ingest(api, writes, name=f"health-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 30
    while not api.get(f"/api/runs/{run_id}/health").json()["alerts"]:
        assert time.monotonic() < deadline, "no alert"
        time.sleep(0.1)
    page.goto(f"{server.url}/?token={server.admin_key}#/runs")
    page.wait_for_selector("main[data-ready=runs]")
    row = page.locator("#runs tbody tr", has=page.locator(f"text={run_id}"))
    assert row.locator(".health").get_attribute("data-health") == "critical"
    assert row.locator(".points").inner_text() == "310"  # 8 ranks x 40 steps, less rank 4's 10
    row.locator("a.run-link").click()
    page.wait_for_selector("#health-banner")
    shot(page, "health-banner")
    banner = page.inner_text("#health-banner")
    assert "critical" in banner and "rank missing" in banner and "rank 4 · step 30" in banner
    page.click("#health-banner a.alert-link")
    page.wait_for_selector("main[data-ready=distributed]")
    assert "step_min=0" in page.url and "step_max=80" in page.url
    assert page.errors == []


def test_lost_and_lagging_ranks(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    """A run whose rank 3 never finished while the others did reads "finished, 1 rank
    lost" on the runs list; a live run's rank that is behind but sending is listed as
    behind, not missing."""

    def run(name: str, lag: float, ranks: dict[int, int]) -> str:
        run_id = f"{name}-{uuid.uuid4().hex[:6]}"
        api.post("/runs", json={"project": "dash", "id": run_id}).raise_for_status()
        health = [{"path": "health/lag_seconds", "type": "health", "value": lag}]
        api.post(f"/api/runs/{run_id}/attributes", json={"attributes": health}).raise_for_status()
        events = [
            {"event_id": f"{run_id}-{s}-{r}", "request": {"method": "POST",
             "path": f"/runs/{run_id}/rank-metrics",
             "body": {"metrics": {"loss": 1.0}, "step": s, "rank": r, "world_size": 4}}}
            for r, last in ranks.items() for s in range(last + 1)
        ]  # fmt: skip
        api.post("/api/ingest", json={"events": events}).raise_for_status()
        return run_id

    lost = run("lost", 1.0, {0: 20, 1: 20, 2: 20, 3: 12})
    for rank in (0, 1, 2):
        body = {"status": "finished", "rank": rank}
        api.patch(f"/runs/{lost}", json=body).raise_for_status()
    live = run("live", 60.0, {0: 20, 1: 20, 2: 20, 3: 12})
    deadline = time.monotonic() + 10  # rank 3 quiet for its 1 s of lag_seconds
    while not api.get(f"/runs/{lost}").json()["run"]["ranks_lost"]:
        assert time.monotonic() < deadline, "rank 3 not lost"
        time.sleep(0.2)
    assert api.get(f"/runs/{lost}").json()["run"]["ranks_lost"] == [{"rank": 3, "last_step": 12}]
    page.goto(f"{server.url}/?token={server.admin_key}#/runs")
    page.wait_for_selector("main[data-ready=runs]")
    row = page.locator("#runs tbody tr", has=page.locator(f"text={lost}"))
    assert "finished, 1 rank lost" in row.inner_text()
    # An unnamed run is shown by its id once (in "name"), not again in "id".
    assert row.inner_text().count(lost) == 1
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{live}/distributed?key=loss")
    page.wait_for_selector("main[data-ready=distributed]")
    shot(page, "lagging-rank")
    listed = page.inner_text("#missing")
    assert "rank 3 behind at step 12" in listed and "missing from" not in listed
    assert page.errors == []


def test_pages_fit_a_1280_px_window(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    """At 1280 px no card is wider than the page, scalars logged once show as values (not
    empty charts), a config's None is null, and Plotly's tips do not stay on the page."""
    run_id = f"fit-{uuid.uuid4().hex[:6]}"
    long_name = "a-rather-long-run-name-" + "x" * 60
    api.post("/runs", json={"project": "fit", "id": run_id, "name": long_name,
                            "config": {"warmup": None, "lr": 0.1}}).raise_for_status()  # fmt: skip
    events = [{"event_id": f"{run_id}-s{s}", "request": {"method": "POST",
               "path": f"/runs/{run_id}/metrics",
               "body": {"metrics": {"eval/loss": 1.0 / (s + 1)}, "step": s}}}
              for s in range(20)]  # fmt: skip
    events.append({"event_id": f"{run_id}-flos", "request": {"method": "POST",
                   "path": f"/runs/{run_id}/metrics",
                   "body": {"metrics": {"total_flos": 999041.0e9}, "step": 20}}})  # fmt: skip
    events += [{"event_id": f"{run_id}-{s}-{r}", "request": {"method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {"metrics": {"train/loss": 1.0 + 0.01 * r + (5.0 if r == 3 and s % 7 == 0 else 0),
                                     "perf/forward_ms": 10.0 + r}, "step": s, "rank": r,
                         "world_size": 16, "local_rank": r % 8}}}
               for s in range(60) for r in range(16)]  # fmt: skip
    api.post("/api/ingest", json={"events": events}).raise_for_status()
    page.set_viewport_size({"width": 1280, "height": 900})

    def fits(where: str) -> None:
        wide = page.evaluate(
            "[document.documentElement.scrollWidth, ...[...document.querySelectorAll('.card')]"
            ".filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.querySelector('h3')?.textContent)]"
        )
        assert wide[0] <= 1280 and wide[1:] == [], (where, wide)

    page.goto(f"{server.url}/?token={server.admin_key}#/runs")
    page.wait_for_selector("main[data-ready=runs]")
    fits("runs")
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}")
    page.wait_for_selector("main[data-ready=overview]")
    fits("overview")
    values = page.inner_text("#single-values")
    assert "total_flos" in values and "eval/loss" not in values
    assert '"warmup": null' in page.inner_text("#config")
    page.goto(f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed")
    page.wait_for_selector("main[data-ready=distributed]")
    fits("distributed")
    shot(page, "distributed-1280")
    # 16 ranks: the per-rank table is cut at its card's height, and says it scrolls.
    assert (
        page.evaluate(
            "[...document.querySelectorAll('.scroll-hint')].filter(h => !h.hidden).length"
        )
        >= 1
    )
    band = page.locator("#band .nsewdrag").first.bounding_box()
    page.mouse.move(band["x"] + 50, band["y"] + 50)
    page.mouse.down()
    page.mouse.move(band["x"] + 200, band["y"] + 60)
    page.mouse.up()
    time.sleep(1.0)
    assert page.evaluate("document.querySelectorAll('.notifier-note').length") == 0
    assert page.errors == []


def test_the_node_table_and_a_heatmap_grouped_by_node(
    page: Any, server: ServerProcess, api: httpx.Client
) -> None:
    """16 ranks on two nodes, node-b's forward three times as slow: the Distributed tab
    shows one row per node with node-b's straggler score flagged, and the heatmap's rows
    grouped by node."""
    run_id = f"nodes-{uuid.uuid4().hex[:6]}"
    api.post("/runs", json={"project": "dash", "id": run_id}).raise_for_status()
    events = []
    for step in range(60):
        for rank in range(16):
            node = "node-a" if rank % 2 == 0 else "node-b"  # interleaved: the order must group
            body = {"metrics": {"perf/forward_ms": 30.0 if node == "node-b" else 10.0,
                                "train/loss": 1.0 + 0.01 * rank},
                    "step": step, "rank": rank, "world_size": 16, "node": node}  # fmt: skip
            events.append({"event_id": f"{run_id}-{step}-{rank}", "request": {
                "method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body}})  # fmt: skip
    api.post("/api/ingest", json={"events": events}).raise_for_status()
    page.goto(
        f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed?key=perf/forward_ms"
    )
    page.wait_for_selector("main[data-ready=distributed]")
    rows = page.locator("#nodes tbody tr")
    assert rows.count() == 2
    texts = {rows.nth(i).locator("td").first.inner_text(): rows.nth(i) for i in range(2)}
    assert set(texts) == {"node-a", "node-b"}
    assert texts["node-b"].locator("span.bad").count() == 1  # its straggler score
    assert texts["node-a"].locator("span.bad").count() == 0
    assert "0, 2, 4" in texts["node-a"].inner_text()  # even ranks, not a range
    labels = page.evaluate("document.getElementById('heatmap').data[0].y")
    assert labels[:8] == [f"node-a · {r}" for r in range(0, 16, 2)]
    assert labels[8:] == [f"node-b · {r}" for r in range(1, 16, 2)]
    shot(page, "nodes")
    assert page.errors == []


def test_runs_compared_side_by_side(page: Any, server: ServerProcess, api: httpx.Client) -> None:
    """Tick two runs on the runs list, compare: their bands overlaid, their per-rank,
    node and straggler tables side by side."""
    from tests.server.test_compare import _job

    before, after = _job(api, 3, 2.0), _job(api, None, 1.5)
    page.goto(f"{server.url}/?token={server.admin_key}#/runs?project=compare")
    page.wait_for_selector("main[data-ready=runs]")
    assert page.is_disabled("#compare")
    page.check(f"input.pick[data-run='{before}']")
    assert page.is_disabled("#compare")  # one run: nothing to compare
    page.check(f"input.pick[data-run='{after}']")
    page.click("#compare")
    page.wait_for_selector("main[data-ready=compare]")
    assert page.input_value("#compare-key") == "train/loss"
    names = page.evaluate("document.getElementById('compare-band').data.map((t) => t.name)")
    assert f"{before} mean" in names and f"{after} mean" in names
    cards = page.locator("#compare-runs > .card")
    assert cards.count() == 2
    assert cards.nth(0).get_attribute("data-run") == before
    assert cards.nth(0).locator("#stragglers tbody tr").count() == 4
    assert cards.nth(0).locator("#nodes span.bad").count() == 1  # n1's score, before the fix
    assert cards.nth(1).locator("#nodes span.bad").count() == 0
    assert cards.nth(1).locator("tbody tr").count() >= 4
    shot(page, "compare")
    page.select_option("#compare-key", "perf/forward_ms")
    page.wait_for_selector("main[data-ready=compare]")
    wait_until(page, "document.getElementById('compare-key').value === 'perf/forward_ms'")
    assert page.errors == []


def test_a_real_job_on_two_nodes_in_the_node_table(page: Any, server: ServerProcess) -> None:
    """16 real rank processes on two named nodes, node-b three times as slow: the
    Distributed tab's node table flags node-b's straggler score, not node-a's."""
    from tests.health.test_node_job import launch_on_nodes

    run_id = f"two-nodes-{uuid.uuid4().hex[:6]}"
    procs = launch_on_nodes(server, run_id)
    for proc in procs:
        assert proc.wait(timeout=180) == 0
    page.goto(
        f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed?key=perf/forward_ms"
    )
    page.wait_for_selector("main[data-ready=distributed]")
    rows = page.locator("#nodes tbody tr")
    assert rows.count() == 2
    cells = {rows.nth(i).locator("td").first.inner_text(): rows.nth(i) for i in range(2)}
    assert cells["node-b"].locator("span.bad").count() == 1
    assert cells["node-a"].locator("span.bad").count() == 0
    labels = page.evaluate("document.getElementById('heatmap').data[0].y")
    assert labels[0] == "node-a · 0" and labels[-1] == "node-b · 15"
    assert page.errors == []
