"""``instantml sync``: drain a spool dir into the server."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..sdk import config
from ..spool import segments
from .http import ENV_HELP, CliError

DEFAULT_RETRY_FOR = 300.0


def _check_spool(spool: Path, follow: bool) -> None:
    """A spool is a directory with ``segments/`` in it (``init`` makes both). Without
    ``--follow`` a missing one is a mistake worth saying, not an empty success."""
    if spool.exists() and not spool.is_dir():
        raise CliError(f"--spool-dir {spool} is a file, not a spool directory")
    if follow or segments.segment_dir(spool).is_dir():
        return
    if not spool.exists():
        raise CliError(
            f"no spool at {spool}: nothing was spooled there (check --spool-dir or"
            " INSTANTML_SPOOL_DIR; `--follow` waits for one)"
        )
    raise CliError(f"{spool} is not a spool directory (it has no segments/ folder)")


def _notifier(console: Any | None) -> Callable[[str], None]:
    """Outage and recovery lines: through the progress bar's console on a terminal, else
    to stderr with the time (the background uploader's stderr is its log file)."""

    def notify(message: str) -> None:
        if console is not None:
            console.print(message, style="yellow", highlight=False, markup=False)
        else:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=sys.stderr, flush=True)

    return notify


def _progress() -> tuple[Any, Callable[[Any], None]]:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), transient=True)
    task = bar.add_task("uploading")

    def update(stats: Any) -> None:
        bar.update(task, description=f"uploaded {stats.delivered + stats.replayed:,} events")

    return bar, update


def _summary(stats: Any, spool_dir: str, seconds: float) -> str:
    answered = stats.delivered + stats.replayed + stats.dead_lettered
    refused = f", {stats.refused_runs} refused runs set aside" if stats.refused_runs else ""
    return (
        f"synced {spool_dir}: {stats.delivered:,} events delivered, {stats.replayed:,} already"
        f" delivered, {stats.dead_lettered:,} refused (in dead-letter.jsonl),"
        f" {stats.torn:,} torn lines skipped{refused}; {stats.segments_done} segments finished"
        f" in {seconds:.2f} s ({answered / max(seconds, 1e-9):,.0f} events/s)"
    )


def run(args: argparse.Namespace) -> int:
    from ..spool.uploader import AlreadyRunning, Uploader, UploadStopped

    spool = Path(args.spool_dir)
    _check_spool(spool, args.follow)
    progress = None
    if sys.stderr.isatty():
        try:
            progress = _progress()
        except ImportError:  # the SDK alone, without rich: no bar
            progress = None
    url = config.resolve_base_url(None)
    uploader = Uploader(
        spool,
        url,
        config.resolve_api_key(None),
        batch_events=args.batch_events,
        retry_for=None if args.follow else args.retry_for,
        on_progress=progress[1] if progress else None,
        notify=_notifier(progress[0].console if progress else None),
    )
    # A stop request ends the pass at once (the uploader waits on the network in slices);
    # whatever was not answered stays in the spool for the next run.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: uploader.stop())
    if args.follow and not spool.exists():
        _notifier(None)(f"waiting for a spool at {spool}")
    started = time.perf_counter()
    try:
        with uploader:
            if progress:
                progress[0].start()
            try:
                stats = uploader.run(follow=args.follow, until_done=args.until_done)
            finally:
                if progress:
                    progress[0].stop()
    except AlreadyRunning as exc:
        if args.quiet_if_running:
            return 0
        raise CliError(str(exc), code=3) from None
    except UploadStopped as exc:
        print(_summary(uploader.stats, args.spool_dir, time.perf_counter() - started), flush=True)
        raise CliError(
            f"{exc}. The spool is intact; run `instantml sync` again once resolved."
        ) from None
    print(_summary(stats, args.spool_dir, time.perf_counter() - started), flush=True)
    if stats.refused_runs:
        raise CliError(
            f"the server refused to create {stats.refused_runs} run(s); their events are kept"
            f" in {spool / 'refused'} and were not sent (see above)"
        )
    if uploader.interrupted:
        print(
            f"stopped before {spool} was drained; the rest stays in it for the next"
            " `instantml sync`",
            file=sys.stderr,
        )
        return 1
    return 0


def add_command(commands: Any) -> None:
    sync = commands.add_parser(
        "sync",
        help="upload a spool dir to the server",
        description="Upload what spool-mode training processes wrote to a spool dir. Each event"
        " goes with its id as Idempotency-Key: re-running, or running after a crash, never"
        " counts anything twice. Exit status: 0 drained, 1 not drained (server refused,"
        " unreachable past --retry-for, stopped), 3 another uploader holds the spool.",
        epilog=ENV_HELP,
    )
    sync.add_argument(
        "--spool-dir",
        default=os.environ.get("INSTANTML_SPOOL_DIR", ".instantml/spool"),
        help="the spool to upload (default: INSTANTML_SPOOL_DIR, else .instantml/spool)",
    )
    sync.add_argument(
        "--follow",
        action="store_true",
        help="keep uploading new events until stopped (Ctrl-C, SIGTERM); never gives up",
    )
    sync.add_argument(
        "--until-done",
        action="store_true",
        help="keep going until every writer has finished and all is delivered",
    )
    sync.add_argument(
        "--retry-for",
        type=float,
        default=DEFAULT_RETRY_FOR,
        metavar="SECONDS",
        help="give up (exit 1, spool intact) when the server stays unreachable or failing"
        f" this long (default {DEFAULT_RETRY_FOR:g}; with --until-done, counted once every"
        " writer has finished; ignored with --follow)",
    )
    sync.add_argument("--quiet-if-running", action="store_true", help=argparse.SUPPRESS)
    sync.add_argument(
        "--batch-events",
        type=int,
        default=10_000,
        help="events per request (default 10,000: the most any server must take)",
    )
    sync.set_defaults(func=run)
