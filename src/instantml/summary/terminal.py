"""The Distributed summary in a terminal (``instantml ranks``), for clusters over SSH."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..health.detectors import rank_ranges

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float | None = None, hi: float | None = None) -> str:
    """Bars from ``lo`` (the lowest) to ``hi`` (the highest), by default the values' own
    range; a flat line at the top of a fixed scale is full bars, not empty ones."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    if span == 0:
        return _BLOCKS[0] * len(values)
    return "".join(_BLOCKS[max(0, min(7, int((v - lo) / span * 8)))] for v in values)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def missing_ranges(missing: list[dict[str, Any]]) -> list[tuple[str, int | None, int]]:
    """Missing ranks as ``(ranks, last seen, vanished at)`` rows, consecutive ranks that
    vanished together in one row ("8-511"): a job that lost a node shows one line."""
    rows: list[tuple[int, int, int | None, int]] = []
    for m in missing:
        seen, gone = m["last_seen_step"], m["first_missing_step"]
        if rows and rows[-1][1] == m["rank"] - 1 and rows[-1][2:] == (seen, gone):
            rows[-1] = (rows[-1][0], m["rank"], seen, gone)
        else:
            rows.append((m["rank"], m["rank"], seen, gone))
    return [(str(lo) if lo == hi else f"{lo}-{hi}", seen, gone) for lo, hi, seen, gone in rows]


def render(summary: dict[str, Any], worst: int = 8, outliers: int = 10) -> Group:
    """Coverage and missing ranks, the worst ranks, the top outliers, and sparklines."""
    steps = summary["steps"]
    cov = summary["coverage"]
    head = Text.assemble(
        (f"run {summary['run_id']}", "bold"),
        f"  key {summary['key']}  world size {summary['world_size']}",
        f"  steps {summary['step_range'][0]}-{summary['step_range'][1]}"
        if summary["step_range"]
        else "  no steps",
        f"  (buckets of {summary['bucket_size']} steps from step 0)"
        if summary["bucket_size"] > 1
        else "",
    )
    trend = Table.grid(padding=(0, 1))
    trend.add_row(
        "mean   ",
        sparkline([s["mean"] for s in steps if s["mean"] is not None]),
        f"{_num(steps[0]['mean'])} -> {_num(steps[-1]['mean'])}" if steps else "",
    )
    trend.add_row(
        "p05-p95",
        sparkline([s["p95"] - s["p05"] for s in steps if s["p95"] is not None]),
        "spread across ranks" if steps else "",
    )
    trend.add_row(
        "coverage",
        sparkline([(s["count"] + s["nonfinite"]) / s["expected"] for s in steps], 0.0, 1.0),
        f"{cov['full_steps']} full, {cov['partial_steps']} partial steps",
    )

    missing = Table(title="Missing from the last step", title_justify="left", expand=False)
    for column in ("ranks", "last seen", "vanished at"):
        missing.add_column(column, justify="right")
    for ranks_text, seen, gone in missing_ranges(cov["missing"]):
        missing.add_row(ranks_text, "never" if seen is None else str(seen), str(gone))

    ranks = Table(title=f"Worst ranks (of {len(summary['ranks'])})", title_justify="left")
    for column in (
        "rank",
        "node",
        "local",
        "steps",
        "last step",
        "mean delta",
        "mean |z|",
        "outlier steps",
        "non-finite",
    ):
        ranks.add_column(column, justify="right")
    for r in summary["ranks"][:worst]:
        ranks.add_row(
            str(r["rank"]),
            r.get("node") or "-",
            "-" if r["local_rank"] is None else str(r["local_rank"]),
            str(r["steps_reported"]),
            str(r["last_step"]),
            _num(r["mean_delta"]),
            f"{r['mean_abs_z']:.2f}",
            str(r["outlier_steps"]),
            str(r["nonfinite_steps"]),
        )

    by_node = Table(title="Nodes", title_justify="left")
    for column in ("node", "ranks", "missing", "mean delta", "mean |z|", "outlier steps"):
        by_node.add_column(column, justify="right")
    for n in summary.get("nodes") or []:
        by_node.add_row(
            n["node"] or "-",
            rank_ranges(n["ranks"]),
            rank_ranges(n["missing_ranks"]) or "-",
            _num(n["mean_delta"]),
            f"{n['mean_abs_z']:.2f}",
            str(n["outlier_steps"]),
        )

    shown = min(outliers, len(summary["outliers"]))
    top = Table(
        title=f"Top outliers ({shown} of {summary['outliers_total']})", title_justify="left"
    )
    for column in ("step", "rank", "value", "step mean", "delta", "z", "robust z"):
        top.add_column(column, justify="right")
    for o in summary["outliers"][:outliers]:
        top.add_row(
            str(o["step"]),
            str(o["rank"]),
            _num(o["value"]),
            _num(o["mean"]),
            _num(o["delta"]),
            f"{o['z']:.2f}",
            f"{o['robust_z']:.2f}",
        )

    keys = Text.assemble(("rank metrics: ", "dim"), ", ".join(summary.get("keys", [])))
    parts: list[Any] = [head, keys, Panel(trend, title="across ranks", expand=False)]
    first = summary.get("first_nonfinite")
    if first is not None:
        total = sum(s.get("nonfinite_total", s["nonfinite"]) for s in steps)
        parts.append(
            Text(
                f"First non-finite value: rank {first['rank']} at step {first['step']}"
                f" ({first['value']}); {total} non-finite values in this range.",
                style="bold red",
            )
        )
    parts.append(
        missing if cov["missing"] else Text("No rank missing from the last step.", style="green")
    )
    lagging = cov.get("lagging") or []
    if lagging:
        behind = ", ".join(f"rank {g['rank']} at step {g['last_step']}" for g in lagging)
        parts.append(Text(f"Behind but sending (uploads lag): {behind}.", style="yellow"))
    if summary.get("nodes"):
        parts.append(by_node)
    parts += [ranks, top if summary["outliers"] else Text("No outliers.", style="green")]
    return Group(*parts)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(render(summary))


def render_stragglers(results: list[dict[str, Any]], shown: int = 8) -> Group:
    """Per timing key: the flagged ranks, by how much, and the slowest ranks' scores."""
    parts: list[Any] = []
    for result in results:
        key, ranks = result["key"], result["ranks"]
        span = result["step_range"]
        head = f"{key}: last {result['window']} steps" + (
            f" ({span[0]}-{span[1]})" if span else " (no steps)"
        )
        flagged = [r for r in ranks if r["straggler"]]
        if flagged:
            worst = ", ".join(
                f"rank {r['rank']} ({1 / r['score']:.2f}x the fastest)" if r["score"] > 0
                else f"rank {r['rank']}"
                for r in flagged
            )  # fmt: skip
            parts.append(Text(f"{head}: stragglers {worst}", style="bold red"))
        else:
            parts.append(Text(f"{head}: no straggler", style="green"))
        nodes = [n for n in result.get("nodes") or [] if n["straggler"]]
        if nodes:
            said = ", ".join(
                f"node {n['node']} (slowest rank {n['slowest_rank']}, score {n['score']:.2f})"
                for n in nodes
            )
            parts.append(Text(f"{key}: slow nodes {said}", style="bold red"))
        table = Table(show_edge=False)
        for column in ("rank", "node", "median ms", "score", "steps"):
            table.add_column(column, justify="right")
        for r in ranks[:shown]:
            table.add_row(
                str(r["rank"]),
                r.get("node") or "-",
                _num(r["median"]),
                Text(f"{r['score']:.2f}", style="red" if r["straggler"] else ""),
                str(r["steps"]),
            )
        parts.append(table)
    return Group(*parts)


def print_stragglers(results: list[dict[str, Any]], console: Console | None = None) -> None:
    (console or Console()).print(render_stragglers(results))


def render_compare(answer: dict[str, Any], worst: int = 5) -> Group:
    """Runs side by side on one key: a column per run (the last step's reducers, coverage,
    missing ranks, the noisiest ranks, slow nodes) and each run's mean as a sparkline."""
    runs = answer["runs"]
    table = Table(title=f"{answer['key']}: {len(runs)} runs", title_justify="left")
    table.add_column("")
    for entry in runs:
        table.add_column(entry["run"]["id"], justify="right")

    def row(name: str, cell: Any) -> None:
        table.add_row(name, *(cell(entry) for entry in runs))

    def last(name: str) -> Any:
        return lambda e: "-" if e["last"] is None else _num(e["last"].get(name))

    row("status", lambda e: e["run"]["status"])
    row("world size", lambda e: str(e["world_size"]))
    row("steps", lambda e: "-" if e["step_range"] is None else "{}-{}".format(*e["step_range"]))
    for name in ("mean", "weighted_mean", "p50", "p95", "std"):
        row(f"last {name.replace('_', ' ')}", last(name))
    row("full steps", lambda e: str(e["coverage"]["full_steps"]))
    row("missing", lambda e: rank_ranges([m["rank"] for m in e["coverage"]["missing"]]) or "-")
    row(
        f"noisiest {worst}",
        lambda e: ", ".join(str(r["rank"]) for r in e["ranks"][:worst]) or "-",
    )
    row(
        "slow nodes",
        lambda e: (
            ", ".join(
                n["node"] or "-"
                for n in ((e["stragglers"] or {}).get("nodes") or [])
                if n["straggler"]
            )
            or "-"
        ),
    )
    row(
        "stragglers",
        lambda e: ", ".join(map(str, (e["stragglers"] or {}).get("stragglers") or [])) or "-",
    )
    lines = [
        Text.assemble(
            (f"{e['run']['id']}: ", "bold"),
            sparkline([s["mean"] for s in e["steps"] if s["mean"] is not None]),
        )
        for e in runs
    ]
    return Group(table, Panel(Group(*lines), title="mean across ranks", expand=False))


def print_compare(answer: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(render_compare(answer))
