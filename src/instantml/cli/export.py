"""``instantml export``: a key's points to a file (Parquet, CSV, Arrow or JSON), streamed
from the server, with a progress bar on a terminal."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ..sdk.api import Api
from ..sdk.errors import InstantMLError
from .http import ENV_HELP, CliError, base_url, call

FORMATS = ("parquet", "csv", "arrow", "json")


def export(args: argparse.Namespace) -> int:
    run = quote(args.run_id, safe="")
    keys = {k["key"]: k for k in call("GET", f"/api/runs/{run}/keys")["keys"]}
    found = keys.get(args.key)
    if found is None:
        listed = ", ".join(sorted(keys)) or "none yet"
        raise CliError(f"run {args.run_id!r} has no key {args.key!r}; its keys: {listed}")
    target = Path(args.output or _default_name(args.run_id, args.key, args.format))
    partial = target.with_name(target.name + ".part")
    points = int(found["points"])
    try:
        with Api(base_url()) as api, partial.open("wb") as out:
            written = _download(api, args, found["kind"] == "scalar", out, points)
        os.replace(partial, target)
    except (InstantMLError, httpx.HTTPError) as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"export of {args.key!r} from run {args.run_id!r}: {exc}") from None
    print(f"{points} points of {args.key!r} -> {target} ({written:,} bytes, {args.format})")
    return 0


def _download(api: Api, args: argparse.Namespace, scalar: bool, out: Any, points: int) -> int:
    lo, hi = _step(args.step_min), _step(args.step_max)
    if not sys.stderr.isatty():
        return api.download(
            args.run_id, args.key, out, args.format, scalar=scalar, step_min=lo, step_max=hi
        )
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    # The bar's end is an estimate: the points' share of the body is not known in advance.
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task(f"{args.key} ({points:,} points)", total=None)
        return api.download(
            args.run_id, args.key, out, args.format, scalar=scalar, step_min=lo, step_max=hi,
            progress=lambda done: progress.update(task, completed=done),
        )  # fmt: skip


def _step(value: float | None) -> float | None:
    """A whole step as an int (a rank key's steps are integers)."""
    return int(value) if value is not None and value.is_integer() else value


def _default_name(run_id: str, key: str, fmt: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{run_id}-{key}")
    return f"{safe}.{fmt}"


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="write a key's points to a file (parquet, csv, arrow or json)",
        description="Every stored point of one key of a run, streamed from the server:"
        " rank keys as step, rank, local_rank, node, value, weight, world_size; scalar keys"
        " as step, value, timestamp. Non-finite values are NaN or +-inf (JSON: their mark).",
        epilog=ENV_HELP,
    )
    parser.add_argument("run_id", help="the run whose points to export")
    parser.add_argument("--key", required=True, help="the metric key")
    parser.add_argument("--format", choices=FORMATS, default="parquet", help="default parquet")
    parser.add_argument("-o", "--output", default=None, help="default <run>-<key>.<format>")
    parser.add_argument("--step-min", type=float, default=None, help="first step to include")
    parser.add_argument("--step-max", type=float, default=None, help="last step to include")
    parser.set_defaults(func=export)
