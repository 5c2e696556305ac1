"""Starting the uploader from ``init`` (``spool_uploader=True``): a detached process that
outlives training until every segment of the spool is delivered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import segments
from .uploader import LOCK_FILE


def start_background_uploader(
    spool_dir: str | os.PathLike[str], base_url: str, api_key: str | None
) -> None:
    """Spawn ``instantml sync --until-done`` unless an uploader already holds the spool.
    Never raises: training goes on, and ``instantml sync`` can always be run by hand."""
    directory = Path(spool_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if segments.locked(directory / LOCK_FILE):
            return
        env = {**os.environ, "INSTANTML_API_BASE_URL": base_url}
        if api_key:
            env["INSTANTML_API_KEY"] = api_key
        with (directory / "uploader.log").open("ab") as log:
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "instantml",
                    "sync",
                    "--spool-dir",
                    str(directory),
                    "--until-done",
                    "--quiet-if-running",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,  # not killed with the training process's group
            )
    except OSError:
        pass
