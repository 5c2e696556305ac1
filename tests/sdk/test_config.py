"""Run id resolution: all ranks of one job must agree on one id."""

from __future__ import annotations

import pytest

from instantml.sdk.config import resolve_run_id


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
