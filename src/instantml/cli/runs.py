"""``instantml runs`` and ``instantml ranks``: runs and their Distributed summary in a
terminal, for clusters reached over SSH."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from urllib.parse import quote

from .http import ENV_HELP, CliError, call


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _status(run: dict[str, Any]) -> str:
    """The status, with the ranks that never finished ("finished, 1 rank lost")."""
    lost = len(run.get("ranks_lost") or [])
    if not lost:
        return str(run["status"])
    return f"{run['status']}, {lost} rank{'s' if lost > 1 else ''} lost"


def runs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.project:
        params["project"] = args.project
    body = call("GET", "/api/runs", params=params)
    rows = [
        (
            r["id"],
            r["project"],
            _status(r),
            "-" if r["world_size"] is None else str(r["world_size"]),
            "-" if r["last_step"] is None else str(r["last_step"]),
            f"{r.get('points', 0):,}",
            _when(r["updated_at"]),
        )
        for r in body["runs"]
    ]
    if not rows:
        where = f" in project {args.project!r}" if args.project else ""
        print(f"No runs{where}.")
        return 0
    header = ("run id", "project", "status", "world size", "last step", "points", "updated")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def delete(args: argparse.Namespace) -> int:
    run = quote(args.run_id, safe="")
    found = call("GET", f"/runs/{run}")["run"]
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"deleting run {args.run_id!r} needs --yes when not on a terminal")
        what = f"run {args.run_id!r} ({found['project']}, {found.get('points', 0):,} points)"
        if input(f"Delete {what} and everything of it? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Not deleted.")
            return 1
    call("DELETE", f"/api/runs/{run}", timeout=600.0)
    print(f"Deleted run {args.run_id!r}.")
    return 0


def ranks(args: argparse.Namespace) -> int:
    try:
        from ..rankmath.params import default_key
        from ..summary.terminal import print_summary
    except ImportError as exc:
        raise CliError(
            f"`instantml ranks` draws with rich ({exc.name} is missing):"
            " pip install 'instantml[cli]'"
        ) from None
    if args.compare:
        from ..summary.terminal import print_compare

        params = {"runs": ",".join([args.run_id, *args.compare]), "max_points": args.width}
        if args.key:
            params["key"] = args.key
        print_compare(call("GET", "/api/compare", params=params))
        return 0
    run = quote(args.run_id, safe="")
    series = call("GET", f"/api/runs/{run}/keys")["keys"]
    keys = sorted(s["key"] for s in series if s["kind"] == "rank")
    if not keys:
        raise CliError(f"run {args.run_id!r} has no rank metrics yet")
    if args.stragglers:
        return _stragglers(run, args.run_id, keys, args.window)
    key = args.key or default_key(keys)
    if key not in keys:
        raise CliError(
            f"run {args.run_id!r} has no rank metric {key!r}; its rank metrics: {', '.join(keys)}"
        )
    params = {"key": key, "step_min": args.step_min, "step_max": args.step_max}
    params["max_points"] = args.width
    summary = call(
        "GET",
        f"/api/runs/{run}/distributed",
        params={k: v for k, v in params.items() if v is not None},
    )
    print_summary(summary)
    return 0


def _stragglers(run: str, run_id: str, keys: list[str], window: int) -> int:
    from ..summary.terminal import print_stragglers

    timing = [k for k in keys if k.startswith("perf/") and k.endswith("_ms")]
    if not timing:
        raise CliError(
            f"run {run_id!r} has no timing keys (perf/*_ms); its rank metrics: {', '.join(keys)}"
        )
    print_stragglers(
        [
            call("GET", f"/api/runs/{run}/stragglers", params={"key": key, "window": window})
            for key in timing
        ]
    )
    return 0


def add_commands(commands: Any) -> None:
    listing = commands.add_parser(
        "runs",
        help="list runs: id, project, status, world size, last step, points; or delete one",
        epilog=ENV_HELP,
    )
    listing.add_argument("--project", default=None, help="only this project's runs")
    listing.add_argument(
        "--limit", type=int, default=50, help="how many, newest first (default 50, at most 1000)"
    )
    listing.set_defaults(func=runs)
    actions = listing.add_subparsers(dest="action", metavar="[delete]")
    removal = actions.add_parser(
        "delete",
        help="delete a run and everything of it (an admin key)",
        description="Delete a run: its points, aggregates, logs and alerts leave both stores;"
        " the month's usage stays as charged; the id may be used again.",
        epilog=ENV_HELP,
    )
    removal.add_argument("run_id", help="the run to delete")
    removal.add_argument("--yes", action="store_true", help="do not ask")
    removal.set_defaults(func=delete)

    summary = commands.add_parser(
        "ranks",
        help="the Distributed summary of a run in the terminal",
        description="Coverage and missing ranks, the noisiest ranks, the top outliers and"
        " sparklines across ranks, for one rank-metric key of a run.",
        epilog=ENV_HELP,
    )
    summary.add_argument("run_id", help="the run (`instantml runs` lists them)")
    summary.add_argument(
        "--key", default=None, help="rank-metric key (default: a loss if the run has one)"
    )
    summary.add_argument("--step-min", type=int, default=None, help="first step of the range")
    summary.add_argument("--step-max", type=int, default=None, help="last step of the range")
    summary.add_argument(
        "--width", type=int, default=60, help="sparkline resolution in buckets (default 60)"
    )
    summary.add_argument(
        "--stragglers",
        action="store_true",
        help="straggler scores of every timing key (perf/*_ms) instead: the fastest rank's"
        " median over each rank's, below 0.75 flagged",
    )
    summary.add_argument(
        "--window",
        type=int,
        default=200,
        help="with --stragglers: the last N steps scored (default 200)",
    )
    summary.add_argument(
        "--compare",
        action="append",
        default=None,
        metavar="RUN_ID",
        help="compare with this run (repeatable): the runs side by side on one key",
    )
    summary.set_defaults(func=ranks)
