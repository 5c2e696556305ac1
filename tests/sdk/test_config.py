"""Run id resolution: all ranks of one job must agree on one id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from instantml.sdk.config import launcher_ranks, resolve_run_id, unshared_run_warning


@pytest.mark.parametrize(
    ("run_id", "env", "expected"),
    [
        ("mine", {"INSTANTML_RUN_ID": "env", "SLURM_JOB_ID": "7"}, "mine"),
        (None, {"INSTANTML_RUN_ID": "env", "TORCHELASTIC_RUN_ID": "abc"}, "env"),
        (None, {"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "7"}, "torchelastic-abc"),
        (None, {"SLURM_JOB_ID": "7"}, "slurm-7"),
        (None, {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}, "slurm-7.2"),
        (None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}, "slurm-7"),
        (None, {"TORCHELASTIC_RUN_ID": "a/b c"}, "torchelastic-a-b-c"),
    ],
)
def test_resolution_order(run_id: str | None, env: dict[str, str], expected: str) -> None:
    assert resolve_run_id(run_id, env) == expected


def test_fresh_ids_differ_and_bad_ids_are_refused() -> None:
    assert resolve_run_id(None, {}) != resolve_run_id(None, {})
    with pytest.raises(ValueError, match="run_id"):
        resolve_run_id("no spaces", {})
    with pytest.raises(ValueError, match="INSTANTML_RUN_ID"):
        resolve_run_id(None, {"INSTANTML_RUN_ID": "../etc"})


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none"}, "static rendezvous"),
        ({"WORLD_SIZE": "8"}, "no launcher job id"),
        ({"WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "abc"}, None),
        ({"WORLD_SIZE": "8", "SLURM_JOB_ID": "7"}, None),
        ({"WORLD_SIZE": "8", "INSTANTML_RUN_ID": "job"}, None),
        ({"WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}, None),
        ({}, None),
    ],
)
def test_a_multi_rank_job_without_a_shared_id_is_warned(
    env: dict[str, str], warned: str | None
) -> None:
    message = unshared_run_warning(None, env)
    if warned is None:
        assert message is None
    else:
        assert message is not None and warned in message
        for fix in ("--rdzv-id", "INSTANTML_RUN_ID", "run_id="):
            assert fix in message
    assert unshared_run_warning("given", env) is None


def test_the_warning_comes_once_per_process(tmp_path: Path) -> None:
    job = (
        "import instantml as im\n"
        "for _ in range(3):\n"
        f"    im.init(project='p', upload_mode='spool', spool_dir={str(tmp_path)!r}).finish()\n"
    )
    env = {**os.environ, "WORLD_SIZE": "4", "RANK": "1", "TORCHELASTIC_RUN_ID": "none"}
    out = subprocess.run(
        [sys.executable, "-c", job], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("each rank is logging into a run of its own") == 1, out.stderr


SRUN_TASK = {"SLURM_JOB_ID": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2, 1)),
        ({}, (None, None, None)),
        # srun sets no RANK: its task variables say the same thing.
        ({**SRUN_TASK, "SLURM_LOCALID": "1"}, (3, 4, 1)),
        # torchrun under srun: the launcher's own variables win.
        ({**SRUN_TASK, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}, (5, 8, 0)),
        # A batch script's processes are not SLURM tasks (no SLURM_STEP_ID).
        ({"SLURM_JOB_ID": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, (None, None, None)),
    ],
)
def test_ranks_come_from_the_launcher(env: dict[str, str], expected: tuple) -> None:
    assert launcher_ranks(env) == expected
