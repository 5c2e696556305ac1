"""``instantml``: the server, the demo job, and (as they land) sync, ranks, keys, usage."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ._version import __version__


def _server_extra_missing(exc: ImportError) -> int:
    print(
        f"error: this command needs the server extra ({exc.name} is missing):"
        " pip install 'instantml[server]'",
        file=sys.stderr,
    )
    return 2


def _cmd_server(args: argparse.Namespace) -> int:
    try:
        from .server.main import serve
        from .settings import ServerSettings
    except ImportError as exc:
        return _server_extra_missing(exc)
    settings = ServerSettings.from_env(data_dir=args.data_dir, host=args.host, port=args.port)
    serve(settings)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(
        data_dir=Path(args.data_dir).expanduser(),
        port=args.port,
        world_size=args.world_size,
        steps=args.steps,
        upload_mode=args.upload_mode,
        serve=not args.no_serve,
    )


def _cmd_ranks(args: argparse.Namespace) -> int:
    try:
        from .summary.terminal import print_summary
    except ImportError as exc:
        return _server_extra_missing(exc)
    import httpx

    from .sdk import config

    api_key = config.resolve_api_key(None)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    params = {
        "key": args.key,
        "step_min": args.step_min,
        "step_max": args.step_max,
        "max_points": args.width,
    }
    url = config.resolve_base_url(None)
    try:
        response = httpx.get(
            f"{url}/api/runs/{args.run_id}/distributed",
            headers=headers,
            params={k: v for k, v in params.items() if v is not None},
            timeout=60,
        )
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"error: {response.status_code}: {response.json().get('error')}", file=sys.stderr)
        return 1
    print_summary(response.json())
    return 0


def _cmd_sync(args: argparse.Namespace) -> int:
    import signal

    from .sdk import config
    from .spool.uploader import AlreadyRunning, Uploader, UploadStopped

    stop = False

    def request_stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    url = config.resolve_base_url(None)
    progress = _sync_progress() if sys.stderr.isatty() else None
    uploader = Uploader(
        args.spool_dir,
        url,
        config.resolve_api_key(None),
        batch_events=args.batch_events,
        on_progress=progress[1] if progress else None,
    )
    try:
        with uploader:
            if progress:
                progress[0].start()
            started = time.perf_counter()
            try:
                stats = uploader.run(
                    follow=args.follow, until_done=args.until_done, should_stop=lambda: stop
                )
            finally:
                if progress:
                    progress[0].stop()
    except AlreadyRunning as exc:
        if args.quiet_if_running:
            return 0
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except UploadStopped as exc:
        print(
            f"error: {exc}. The spool is intact; run `instantml sync` again once resolved.",
            file=sys.stderr,
        )
        _print_sync(uploader.stats, args.spool_dir, time.perf_counter() - started)
        return 1
    _print_sync(stats, args.spool_dir, time.perf_counter() - started)
    return 0


def _sync_progress() -> tuple[Any, Any]:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), transient=True)
    task = bar.add_task("uploading")

    def update(stats: Any) -> None:
        bar.update(task, description=f"uploaded {stats.delivered + stats.replayed:,} events")

    return bar, update


def _print_sync(stats: Any, spool_dir: str, seconds: float) -> None:
    answered = stats.delivered + stats.replayed + stats.dead_lettered
    print(
        f"synced {spool_dir}: {stats.delivered:,} events delivered, {stats.replayed:,} already"
        f" delivered, {stats.dead_lettered:,} refused (in dead-letter.jsonl),"
        f" {stats.torn:,} torn lines skipped; {stats.segments_done} segments finished"
        f" in {seconds:.2f} s ({answered / max(seconds, 1e-9):,.0f} events/s)",
        flush=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="instantml", description=__doc__)
    parser.add_argument("--version", action="version", version=f"instantml {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run the tracking server and dashboard")
    server.add_argument(
        "--data-dir", default=None, help="where the stores live (default ~/.instantml/data)"
    )
    server.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=None, help="port (default 8765)")
    server.set_defaults(func=_cmd_server)

    demo = commands.add_parser("demo", help="start a server and run an 8-rank demo job against it")
    demo.add_argument("--data-dir", default=".instantml/demo-data")
    demo.add_argument("--port", type=int, default=8765)
    demo.add_argument("--world-size", type=int, default=8)
    demo.add_argument("--steps", type=int, default=200)
    demo.add_argument("--upload-mode", default="spool", choices=["spool", "async", "sync"])
    demo.add_argument("--no-serve", action="store_true", help="stop the server when the job ends")
    demo.set_defaults(func=_cmd_demo)
    sync = commands.add_parser("sync", help="upload a spool dir to the server")
    sync.add_argument(
        "--spool-dir", default=os.environ.get("INSTANTML_SPOOL_DIR", ".instantml/spool")
    )
    sync.add_argument(
        "--follow", action="store_true", help="keep uploading new events until stopped"
    )
    sync.add_argument(
        "--until-done",
        action="store_true",
        help="keep going until every writer has finished and all is delivered",
    )
    sync.add_argument("--quiet-if-running", action="store_true", help=argparse.SUPPRESS)
    sync.add_argument(
        "--batch-events",
        type=int,
        default=10_000,
        help="events per request (10,000: the most any server must take)",
    )
    sync.set_defaults(func=_cmd_sync)

    from .cli_admin import add_commands

    add_commands(commands)

    ranks = commands.add_parser("ranks", help="the Distributed summary of a run in the terminal")
    ranks.add_argument("run_id")
    ranks.add_argument("--key", default=None, help="rank-metric key (default: the first)")
    ranks.add_argument("--step-min", type=int, default=None)
    ranks.add_argument("--step-max", type=int, default=None)
    ranks.add_argument("--width", type=int, default=60, help="sparkline resolution (buckets)")
    ranks.set_defaults(func=_cmd_ranks)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
