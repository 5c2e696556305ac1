"""Reading a server's runs from Python: ``from instantml import Api``.

``Api()`` finds the server and key as ``init`` does (arguments, then
``INSTANTML_API_BASE_URL`` / ``INSTANTML_API_KEY``, then ``~/.instantml/credentials``).
Points come out as pandas DataFrames or pyarrow Tables, read from the server's Arrow
stream (``GET /api/runs/{id}/rank-points?format=arrow``); pandas and pyarrow come with
``pip install 'instantml[analysis]'`` and are imported only when a table is asked for, so
``import instantml`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

from . import config
from .errors import InstantMLError
from .http import error_of, json_body, open_client

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

ANALYSIS = "pip install 'instantml[analysis]'"
FORMATS = ("parquet", "csv", "arrow", "json")


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ImportError(f"tables of points need pyarrow: {ANALYSIS}") from None
    return pyarrow


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(f"DataFrames of points need pandas: {ANALYSIS}") from None
    return pandas


class _Chunks:
    """A readable file over a response's body, for pyarrow's stream reader."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._held = b""
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._held) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._held += chunk
        if size < 0:
            out, self._held = self._held, b""
        else:
            out, self._held = self._held[:size], self._held[size:]
        return out

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class Api:
    """A read (and admin) client of one server."""

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0
    ) -> None:
        self.base_url = config.resolve_base_url(base_url)
        key = config.resolve_api_key(api_key)
        if not key:
            raise InstantMLError(
                "no API key: pass api_key=, set INSTANTML_API_KEY, or write"
                f" {config.credentials_file()}"
            )
        self._client = open_client(self.base_url, key, timeout)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, **params: Any) -> Any:
        response = self._client.get(path, params=_given(params))
        body = json_body(response)
        if response.status_code != 200:
            raise InstantMLError(f"GET {path}: {response.status_code} {error_of(response, body)}")
        return body

    # ---- runs ----

    def runs(self, project: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The org's runs, newest first (each with its ``points``, health, world size...)."""
        runs: list[dict[str, Any]] = self._get("/api/runs", project=project, limit=limit)["runs"]
        return runs

    def run(self, run_id: str) -> dict[str, Any]:
        run: dict[str, Any] = self._get(f"/runs/{run_id}")["run"]
        return run

    def keys(self, run_id: str) -> list[dict[str, Any]]:
        """The run's metric keys: ``key``, ``kind`` (rank or scalar), ``points``, ``last_step``."""
        keys: list[dict[str, Any]] = self._get(f"/api/runs/{run_id}/keys")["keys"]
        return keys

    def summary(self, run_id: str, key: str, **params: Any) -> dict[str, Any]:
        """The Distributed summary of a rank key (``GET /api/runs/{id}/distributed``)."""
        summary: dict[str, Any] = self._get(f"/api/runs/{run_id}/distributed", key=key, **params)
        return summary

    def delete_run(self, run_id: str) -> None:
        """Delete a run and everything of it (an admin key). Its id may be used again."""
        response = self._client.delete(f"/api/runs/{run_id}")
        if response.status_code != 204:
            body = json_body(response)
            raise InstantMLError(
                f"DELETE run {run_id}: {response.status_code} {error_of(response, body)}"
            )

    # ---- points ----

    def rank_table(
        self, run_id: str, key: str, step_min: int | None = None, step_max: int | None = None
    ) -> pa.Table:
        """Every stored point of a rank key as a pyarrow Table: ``step, rank, local_rank,
        node, value, weight, world_size`` (a non-finite value as NaN or +-inf)."""
        return self._table("rank-points", run_id, key, step_min, step_max)

    def rank_points(
        self, run_id: str, key: str, step_min: int | None = None, step_max: int | None = None
    ) -> pd.DataFrame:
        """:meth:`rank_table` as a pandas DataFrame."""
        _pandas()
        return self.rank_table(run_id, key, step_min, step_max).to_pandas()

    def scalar_table(
        self, run_id: str, key: str, step_min: float | None = None, step_max: float | None = None
    ) -> pa.Table:
        """Every stored point of a scalar key: ``step, value, timestamp``."""
        return self._table("metrics", run_id, key, step_min, step_max)

    def scalars(
        self, run_id: str, key: str, step_min: float | None = None, step_max: float | None = None
    ) -> pd.DataFrame:
        """:meth:`scalar_table` as a pandas DataFrame."""
        _pandas()
        return self.scalar_table(run_id, key, step_min, step_max).to_pandas()

    def _table(
        self, route: str, run_id: str, key: str, lo: float | None, hi: float | None
    ) -> pa.Table:
        pyarrow = _pyarrow()
        params = _given({"key": key, "format": "arrow", "step_min": lo, "step_max": hi})
        with self._client.stream("GET", f"/api/runs/{run_id}/{route}", params=params) as response:
            if response.status_code != 200:
                response.read()
                raise InstantMLError(
                    f"{key!r} of run {run_id}: {response.status_code}"
                    f" {error_of(response, json_body(response))}"
                )
            reader = pyarrow.ipc.open_stream(_Chunks(response.iter_bytes()))
            return reader.read_all()

    def download(
        self,
        run_id: str,
        key: str,
        out: IO[bytes],
        fmt: str = "parquet",
        *,
        scalar: bool = False,
        step_min: float | None = None,
        step_max: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Write a key's points to ``out`` as the server streams them (``fmt``: parquet,
        csv, arrow or json); ``progress`` gets the bytes written so far. Bytes written."""
        route = "metrics" if scalar else "rank-points"
        params = _given({"key": key, "format": fmt, "step_min": step_min, "step_max": step_max})
        written = 0
        with self._client.stream("GET", f"/api/runs/{run_id}/{route}", params=params) as response:
            if response.status_code != 200:
                response.read()
                raise InstantMLError(
                    f"{key!r} of run {run_id}: {response.status_code}"
                    f" {error_of(response, json_body(response))}"
                )
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
                if progress is not None:
                    progress(written)
        return written


def _given(params: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}
