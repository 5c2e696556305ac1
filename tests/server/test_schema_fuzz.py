"""schemathesis walks every route of the server's own OpenAPI schema with generated input
(valid and invalid), as the admin: no answer may be a 5xx."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from instantml.server.process import ServerProcess
from tests.helpers import admin_client, rank_body


def test_no_5xx_on_any_generated_input(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server()
    with admin_client(server) as api:  # something for the {run_id} routes to find
        api.post("/runs", json={"project": "p", "id": "fuzz"}).raise_for_status()
        api.post("/runs/fuzz/rank-metrics", json=rank_body()).raise_for_status()
    schemathesis = Path(sys.executable).with_name("schemathesis")
    out = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--header",
            f"Authorization: Bearer {server.admin_key}",
            "--max-examples",
            "40",
            "--seed",
            "7",
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "Tested: " in out.stdout


def test_no_5xx_in_stateful_sequences(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The stateful phase: runs created by ``POST /runs`` followed, through the schema's
    links, into every operation on ``{run_id}`` (writes, reads, health) in generated
    sequences."""
    server = start_server()
    schemathesis = Path(sys.executable).with_name("schemathesis")
    out = subprocess.run(
        [
            str(schemathesis), "run", f"{server.url}/openapi.json",
            "--phases", "stateful", "--checks", "not_a_server_error",
            "--header", f"Authorization: Bearer {server.admin_key}",
            "--max-examples", "60", "--seed", "11", "--request-timeout", "30",
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:]
    assert "Stateful" in out.stdout and "Scenarios:" in out.stdout, out.stdout[-2000:]
    covered = re.search(r"API Links:\s+(\d+) covered", out.stdout)
    assert covered and int(covered.group(1)) >= 8, out.stdout[-2000:]
