"""Sync mode: one request per call, errors raised at the call."""

from __future__ import annotations

import httpx
import pytest

import instantml as im
from instantml.server.process import ServerProcess, free_port
from tests.helpers import stored_rank_points


def test_sync_round_trip(server: ServerProcess, api: httpx.Client) -> None:
    run = im.init(
        project="tests",
        upload_mode="sync",
        base_url=server.url,
        api_key=server.admin_key,
        config={"lr": 0.1},
        tags=["t"],
    )
    run.log_rank_metrics({"loss": 0.5}, step=3, rank=2, world_size=4, weight=64)
    run.log({"acc": 0.9})
    run.finish()
    assert stored_rank_points(api, run.run_id, "loss") == [[3, 2, 0.5, 64.0, None, 4]]
    stored = api.get(f"/runs/{run.run_id}").json()["run"]
    assert (stored["status"], stored["config"], stored["tags"]) == ("finished", {"lr": 0.1}, ["t"])


def test_sync_raises_on_refusal_and_on_no_server(server: ServerProcess) -> None:
    with pytest.raises(im.InstantMLError, match="401"):
        im.init(project="p", upload_mode="sync", base_url=server.url, api_key="iml_bad_key")
    with pytest.raises(im.InstantMLError, match="cannot reach"):
        im.init(
            project="p",
            upload_mode="sync",
            base_url=f"http://127.0.0.1:{free_port()}",
            api_key="k",
            timeout=0.5,
        )


def test_sync_uses_env_and_credentials(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from instantml.sdk import config

    config.credentials_file().parent.mkdir(parents=True)
    config.credentials_file().write_text(
        f'api_key = "{server.admin_key}"\napi_host = "{server.url}"\n'
    )
    monkeypatch.setenv("INSTANTML_RUN_ID", "env-and-credentials")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    run = im.init(project="tests", upload_mode="sync")
    run.log_rank_metrics({"x": 1.0}, step=0)
    run.finish()
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.admin_key}"}
    ) as api:
        assert stored_rank_points(api, run.run_id, "x") == [[0, 1, 1.0, 1.0, 1, 2]]


def test_unknown_upload_mode() -> None:
    with pytest.raises(ValueError, match="upload_mode"):
        im.init(project="p", upload_mode="bogus")
