"""``instantml watch RUN_ID``: a run's health alerts as they open and resolve, for job
scripts and schedulers (docs/reference.md, "Run health").

Exit codes: 3 when an alert of a ``--fail-on`` kind is open; 0 when the run finishes with
none open; 1 when the run ends failed or crashed; 2 on ``--timeout`` or an error (no
server, a bad key). A run that does not exist yet is waited for (a job script starts the
watch before the job), until ``--timeout``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from urllib.parse import quote

from .http import ENV_HELP, CliError, call

KINDS = ("rank_missing", "straggler", "outlier_burst", "non_finite")
FIRED, FINISHED, ENDED_BADLY, TIMED_OUT = 3, 0, 1, 2


def _kinds(raw: str) -> frozenset[str]:
    kinds = frozenset(k.strip() for k in raw.split(",") if k.strip())
    unknown = sorted(kinds - set(KINDS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown kind {', '.join(unknown) or '(none)'}; kinds: {', '.join(KINDS)}"
        )
    return kinds


def _line(verb: str, alert: dict[str, Any]) -> str:
    key = f" {alert['key']}" if alert.get("key") else ""
    stamp = time.strftime("%H:%M:%S")
    return (
        f"{stamp} {verb:<8} {alert['kind']} rank {alert['rank']}{key} since step"
        f" {alert['since_step']}: {alert['message']}"
    )


def _until_it_exists(args: argparse.Namespace, deadline: float | None) -> bool:
    """Wait for the run to be created; False when ``--timeout`` came first."""
    run = quote(args.run_id, safe="")
    said = False
    while True:
        try:
            call("GET", f"/runs/{run}")
            return True
        except CliError as exc:
            if exc.status != 404:
                raise
        if not said:
            print(f"run {args.run_id} does not exist yet: waiting for it", file=sys.stderr)
            said = True
        if deadline is not None and time.monotonic() >= deadline:
            print(f"run {args.run_id}: not created within {args.timeout:g} s", file=sys.stderr)
            return False
        time.sleep(args.interval)


def watch(args: argparse.Namespace) -> int:
    run = quote(args.run_id, safe="")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    shown: dict[str, bool] = {}  # alert id -> resolved, as last printed
    try:
        if not _until_it_exists(args, deadline):
            return TIMED_OUT
        while True:
            health = call("GET", f"/api/runs/{run}/health")
            for alert in health["alerts"]:
                before = shown.get(alert["id"])
                if before is None and not alert["resolved"]:
                    print(_line("OPEN", alert), flush=True)
                elif before is False and alert["resolved"]:
                    print(_line("RESOLVED", alert), flush=True)
                shown[alert["id"]] = alert["resolved"]
            fired = [a for a in health["alerts"] if not a["resolved"] and a["kind"] in args.fail_on]
            if fired:
                kinds = ", ".join(sorted({a["kind"] for a in fired}))
                print(f"run {args.run_id}: {kinds} - failing (exit {FIRED})", file=sys.stderr)
                return FIRED
            status = call("GET", f"/runs/{run}")["run"]["status"]
            if status == "finished":
                print(f"run {args.run_id} finished healthy", file=sys.stderr)
                return FINISHED
            if status in ("failed", "crashed"):
                print(f"run {args.run_id} ended {status}", file=sys.stderr)
                return ENDED_BADLY
            if deadline is not None and time.monotonic() >= deadline:
                print(f"run {args.run_id}: still running after {args.timeout:g} s", file=sys.stderr)
                return TIMED_OUT
            time.sleep(args.interval)
    except CliError as exc:
        raise CliError(str(exc), code=TIMED_OUT) from None


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "watch",
        help="print a run's health alerts as they come; exit 3 when one of --fail-on fires",
        description="Print a run's health alerts as they open and resolve. Exit 3 when an"
        " alert of a --fail-on kind is open, 0 when the run finishes with none, 1 when it ends"
        " failed or crashed, 2 on --timeout or an error. A run that does not exist yet is"
        " waited for.",
        epilog=ENV_HELP,
    )
    parser.add_argument("run_id", help="the run (`instantml runs` lists them)")
    parser.add_argument(
        "--fail-on",
        type=_kinds,
        default=frozenset(KINDS),
        help=f"comma-separated kinds that fail the watch (default: all of {', '.join(KINDS)})",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up (exit 2) after this many seconds"
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between looks (default 1)"
    )
    parser.set_defaults(func=watch)
