"""``instantml``: the server, the demo job, and (as they land) sync, ranks, keys, usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    demo.add_argument("--upload-mode", default="async", choices=["async", "sync"])
    demo.add_argument("--no-serve", action="store_true", help="stop the server when the job ends")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
