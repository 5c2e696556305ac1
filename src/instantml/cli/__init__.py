"""The ``instantml`` command line: the server, a demo job, and the client commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from .._version import __version__
from . import admin, export, runs, sync, watch
from .http import ENV_HELP, CliError

DESCRIPTION = """\
InstantML: experiment tracking with per-rank metrics for distributed training.

  instantml server     run the tracking server and dashboard (embedded storage)
  instantml demo       start a server and run an 8-rank demo job against it
  instantml sync       upload a spool dir that spool-mode training processes wrote
  instantml runs       list runs
  instantml ranks      a run's Distributed summary in the terminal
  instantml watch      a run's health alerts as they come (exit codes for job scripts)
  instantml keys       create, list and revoke API keys
  instantml usage      metric points used this month, and limits

`instantml <command> --help` says more about each."""


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, naming the command and where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _extra_missing(exc: ImportError, extra: str = "server") -> CliError:
    return CliError(
        f"this command needs the {extra} extra ({exc.name} is missing):"
        f" pip install 'instantml[{extra}]'",
        code=2,
    )


def _server(args: argparse.Namespace) -> int:
    try:
        from ..server.main import StartError, serve
        from ..settings import ServerSettings
    except ImportError as exc:
        raise _extra_missing(exc) from None
    settings = ServerSettings.from_env(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        metadata_url_setting=args.metadata_url,
        points_url_setting=args.points_url,
        write_credentials=False if args.no_credentials else None,
        workers=args.workers,
    )
    try:
        serve(settings)
    except StartError as exc:
        raise CliError(str(exc)) from None
    return 0


def _demo(args: argparse.Namespace) -> int:
    try:
        from ..demo import main as demo_main
    except ImportError as exc:
        raise _extra_missing(exc) from None
    return demo_main(
        data_dir=Path(args.data_dir).expanduser(),
        port=args.port,
        world_size=args.world_size,
        steps=args.steps,
        upload_mode=args.upload_mode,
        serve=not args.no_serve,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="instantml",
        description=DESCRIPTION,
        epilog=ENV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"instantml {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")

    server = commands.add_parser("server", help="run the tracking server and dashboard")
    server.add_argument(
        "--data-dir",
        default=None,
        help="where the stores live (default: INSTANTML_DATA_DIR, else ~/.instantml/data)",
    )
    server.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=None, help="port (default 8765)")
    server.add_argument(
        "--metadata-url",
        default=None,
        help="orgs, keys, runs, the ledger: duckdb://PATH or postgresql://USER:PASS@HOST:PORT/DB"
        " (default: INSTANTML_METADATA_URL, else the data dir's file)",
    )
    server.add_argument(
        "--points-url",
        default=None,
        help="metric points: duckdb://PATH, clickhouse://HOST:PORT/DB, chdb://DIR (default:"
        " INSTANTML_POINTS_URL, else the data dir's file)",
    )
    server.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes on the port (default: INSTANTML_WORKERS, else 1); more than one"
        " needs PostgreSQL and ClickHouse (docs/deploy.md)",
    )
    server.add_argument(
        "--no-credentials",
        action="store_true",
        help="do not write ~/.instantml/credentials for the local SDK on first start",
    )
    server.set_defaults(func=_server)

    demo = commands.add_parser(
        "demo",
        help="start a server and run an 8-rank demo job against it",
        description="Start `instantml server` on its own data dir, run a job of rank"
        " processes against it (rank 5 slow and noisy, rank 3 dies at 60%%, rank 7 with a 4x"
        " batch), then keep serving the dashboard until Ctrl-C. It never touches"
        " ~/.instantml/credentials.",
    )
    demo.add_argument(
        "--data-dir",
        default=".instantml/demo-data",
        help="the demo server's data dir (default .instantml/demo-data)",
    )
    demo.add_argument(
        "--port", type=int, default=8765, help="port for the demo server (default 8765)"
    )
    demo.add_argument("--world-size", type=int, default=8, help="rank processes to run (default 8)")
    demo.add_argument("--steps", type=int, default=200, help="steps per rank (default 200)")
    demo.add_argument(
        "--upload-mode",
        default="spool",
        choices=["spool", "async", "sync"],
        help="how the ranks upload (default spool: local files and a background uploader)",
    )
    demo.add_argument(
        "--no-serve",
        action="store_true",
        help="stop the server when the job ends, instead of serving until Ctrl-C",
    )
    demo.set_defaults(func=_demo)

    sync.add_command(commands)
    runs.add_commands(commands)
    export.add_command(commands)
    watch.add_command(commands)
    admin.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


__all__ = ["build_parser", "main"]


if __name__ == "__main__":
    sys.exit(main())
