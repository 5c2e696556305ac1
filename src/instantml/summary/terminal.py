"""The Distributed summary in a terminal (``instantml ranks``), for clusters over SSH."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    if span == 0:
        return _BLOCKS[0] * len(values)
    return "".join(_BLOCKS[min(7, int((v - lo) / span * 8))] for v in values)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


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
        f"  (bucket {summary['bucket_size']})" if summary["bucket_size"] > 1 else "",
    )
    trend = Table.grid(padding=(0, 1))
    trend.add_row(
        "mean   ",
        sparkline([s["mean"] for s in steps]),
        f"{_num(steps[0]['mean'])} -> {_num(steps[-1]['mean'])}" if steps else "",
    )
    trend.add_row(
        "p05-p95",
        sparkline([s["p95"] - s["p05"] for s in steps]),
        "spread across ranks" if steps else "",
    )
    trend.add_row(
        "coverage",
        sparkline([s["count"] / s["expected"] for s in steps]),
        f"{cov['full_steps']} full, {cov['partial_steps']} partial steps",
    )

    missing = Table(title="Missing from the last step", title_justify="left", expand=False)
    for column in ("rank", "last seen", "vanished at"):
        missing.add_column(column, justify="right")
    for m in cov["missing"]:
        missing.add_row(
            str(m["rank"]),
            str(m["last_seen_step"]) if m["last_seen_step"] is not None else "never",
            str(m["first_missing_step"]),
        )

    ranks = Table(title=f"Worst ranks (of {len(summary['ranks'])})", title_justify="left")
    for column in (
        "rank",
        "local",
        "steps",
        "last step",
        "mean delta",
        "mean |z|",
        "outlier steps",
    ):
        ranks.add_column(column, justify="right")
    for r in summary["ranks"][:worst]:
        ranks.add_row(
            str(r["rank"]),
            "-" if r["local_rank"] is None else str(r["local_rank"]),
            str(r["steps_reported"]),
            str(r["last_step"]),
            _num(r["mean_delta"]),
            f"{r['mean_abs_z']:.2f}",
            str(r["outlier_steps"]),
        )

    top = Table(title=f"Top outliers (of {len(summary['outliers'])})", title_justify="left")
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

    parts: list[Any] = [head, Panel(trend, title="across ranks", expand=False)]
    parts.append(
        missing if cov["missing"] else Text("No rank missing from the last step.", style="green")
    )
    parts += [ranks, top if summary["outliers"] else Text("No outliers.", style="green")]
    return Group(*parts)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(render(summary))
