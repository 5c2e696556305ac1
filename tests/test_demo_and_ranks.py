"""The README's demo job, and `instantml ranks` on the run it leaves behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from instantml.server.process import ServerProcess, free_port
from tests.helpers import admin_client


def test_demo_then_ranks(tmp_path: Path) -> None:
    data = tmp_path / "demo-data"
    env = {**os.environ, "HOME": str(tmp_path)}
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "instantml",
            "demo",
            "--no-serve",
            "--steps",
            "60",
            "--data-dir",
            str(data),
            "--port",
            str(free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    run_id = re.search(r"Run id: (\S+)", demo.stdout).group(1)  # type: ignore[union-attr]
    with ServerProcess(data, env={"HOME": str(tmp_path)}) as server, admin_client(server) as api:
        step_time = api.get(
            f"/api/runs/{run_id}/distributed", params={"key": "perf/step_time_ms"}
        ).json()
        assert step_time["keys"] == ["optimizer/grad_norm", "perf/step_time_ms", "train/loss"]
        assert step_time["world_size"] == 8
        assert step_time["coverage"]["missing"] == [
            {"rank": 3, "last_seen_step": 36, "first_missing_step": 37}
        ]
        # Rank 5 is the slow one: the furthest above the mean. (Its step times are measured,
        # so under load another rank may be as noisy by |z|; none is as slow.)
        assert max(step_time["ranks"], key=lambda r: r["mean_delta"])["rank"] == 5
        loss = api.get(f"/api/runs/{run_id}/distributed", params={"key": "train/loss"}).json()
        assert loss["ranks"][0]["rank"] == 5  # the noisy shard heads the rollup (seeded data)
        steps = loss["steps"]
        assert any(abs(s["weighted_mean"] - s["mean"]) > 1e-6 for s in steps)  # rank 7's big batch
        out = subprocess.run(
            [sys.executable, "-m", "instantml", "ranks", run_id, "--key", "perf/step_time_ms"],
            env={
                **env,
                "INSTANTML_API_BASE_URL": server.url,
                "INSTANTML_API_KEY": server.admin_key,
                "COLUMNS": "140",
                "NO_COLOR": "1",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"run {run_id}" in text and "world size 8" in text
    assert "Missing from the last step" in text
    assert re.search(r"│\s+3\s+│\s+36\s+│\s+37\s+│", text), text
    worst = text.split("Worst ranks")[1]
    first_row = next(line for line in worst.splitlines() if re.match(r"│\s+\d+\s+│", line))
    assert re.match(r"│\s+5\s+│", first_row), first_row
