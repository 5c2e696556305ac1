"""The scale-out point store's reads for an export (``storage/export.py``): ClickHouse's
own Arrow output (``FINAL``: the latest version of each point), one read per window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..records import RANK
from .engine import ChEngine

if TYPE_CHECKING:
    import pyarrow as pa


class ChExportTables:
    def __init__(self, engine: ChEngine) -> None:
        self._engine = engine

    def _from(self, kind: int) -> str:
        return f"{self._engine.table('rank_points' if kind == RANK else 'scalars')} FINAL"

    def _where(
        self, kind: int, series_id: int, lo: Any, hi: Any, below: bool = False
    ) -> tuple[str, dict[str, Any]]:
        step = "Int64" if kind == RANK else "Float64"
        where, params = "series_id = {sid:UInt64}", {"sid": series_id}
        if lo is not None:
            where += f" AND step >= {{lo:{step}}}"
            params["lo"] = lo
        if hi is not None:
            where += f" AND step {'<' if below else '<='} {{hi:{step}}}"
            params["hi"] = hi
        return where, params

    def extent(
        self, kind: int, series_id: int, lo: float | None, hi: float | None
    ) -> tuple[float, float, int] | None:
        where, params = self._where(kind, series_id, lo, hi)
        ((first, last, points),) = self._engine.rows(
            f"SELECT min(step), max(step), count() FROM {self._from(kind)} WHERE {where}", params
        )
        if not points:
            return None
        if kind == RANK:
            return int(first), int(last), int(points)
        return float(first), float(last), int(points)

    def window(self, kind: int, series_id: int, lo: float, below: float) -> pa.Table:
        where, params = self._where(kind, series_id, lo, below, below=True)
        if kind == RANK:
            select = (
                "SELECT step, toInt32(rank) AS rank,"
                " if(local_rank < 0, NULL, toInt32(local_rank)) AS local_rank, value, weight,"
                " toInt32(world_size) AS world_size"
            )
            order = "step, rank"
        else:
            select, order = "SELECT step, value, ts AS timestamp", "step"
        with self._engine.guarded() as client:
            table: pa.Table = client.query_arrow(
                f"{select} FROM {self._from(kind)} WHERE {where} ORDER BY {order}",
                parameters=params,
            )
        return table
