"""Fixtures: a real ``instantml server`` process on loopback and clients for it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.engines import Engines


@pytest.fixture(scope="session")
def server_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(autouse=True)
def _isolated_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Neither the SDK under test nor a server may touch the real ~/.instantml.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in (
        "INSTANTML_API_KEY",
        "INSTANTML_API_BASE_URL",
        "INSTANTML_RUN_ID",
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    """PostgreSQL and ClickHouse for the session, started when a test first asks."""
    started = Engines(tmp_path_factory.mktemp("engines"))
    yield started
    started.stop()


# The stores the servers of this session run on: the embedded default, or, with
# INSTANTML_TEST_STORES=postgres+chdb (CI runs the HTTP suites that way too), PostgreSQL
# for metadata (a throwaway cluster, a fresh database per server) and ClickHouse's engine
# for points (chdb, a directory per server).
STORES = os.environ.get("INSTANTML_TEST_STORES", "duckdb")


@pytest.fixture(scope="session")
def stores_env(engines: Engines) -> Callable[[Path], dict[str, str]]:
    """``stores_env(data_dir)``: the environment a server on that data dir runs with
    (the same for the same dir, so a restart finds its data)."""
    if STORES == "duckdb":
        return lambda data: {}
    if STORES != "postgres+chdb":
        raise ValueError(f"INSTANTML_TEST_STORES: unknown {STORES!r} (duckdb, postgres+chdb)")
    known: dict[Path, dict[str, str]] = {}

    def env(data: Path) -> dict[str, str]:
        if data not in known:
            known[data] = {
                "INSTANTML_METADATA_URL": engines.postgres().new_database(),
                "INSTANTML_POINTS_URL": f"chdb://{data.parent / (data.name + '-points')}",
            }
        return known[data]

    return env


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    server_home: Path,
    stores_env: Callable[[Path], dict[str, str]],
) -> Iterator[ServerProcess]:
    """One server for the session; tests keep apart by using fresh run ids. Every ingest
    batch it gets is decoded in its decoding process (once that is up), so the suites
    that send batches hold that path to the same answers as the server's own."""
    data = tmp_path_factory.mktemp("server") / "data"
    offload = {"INSTANTML_DECODE_PROCESSES": "1", "INSTANTML_DECODE_MIN_BYTES": "0"}
    with ServerProcess(data, env={"HOME": str(server_home), **stores_env(data), **offload}) as proc:
        yield proc


@pytest.fixture
def start_server(
    tmp_path: Path, stores_env: Callable[[Path], dict[str, str]]
) -> Iterator[Callable[..., ServerProcess]]:
    """A factory for servers of a test's own (to stop, restart or configure)."""
    started: list[ServerProcess] = []

    def start(
        data_dir: Path | None = None, env: dict[str, str] | None = None, **kw: object
    ) -> ServerProcess:
        data = data_dir or tmp_path / f"data{len(started)}"
        proc = ServerProcess(
            data,
            env={"HOME": str(tmp_path / "server-home"), **stores_env(data), **(env or {})},
            **kw,  # type: ignore[arg-type]
        )
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    """An HTTP client holding the admin key of the session server."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def run_id(api: httpx.Client) -> str:
    """A fresh run on the session server."""
    rid = f"t-{uuid.uuid4().hex[:12]}"
    response = api.post("/runs", json={"project": "tests", "id": rid})
    assert response.status_code == 201, response.text
    return rid
