"""The embedded store's reads for an export (``storage/export.py``): DuckDB's own Arrow
output, one short read per window of steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..export import bounded
from ..records import RANK
from .engine import Engine

if TYPE_CHECKING:
    import pyarrow as pa

_RANK = (
    "SELECT step, rank::INTEGER AS rank, nullif(local_rank, -1)::INTEGER AS local_rank, value,"
    " weight, world_size::INTEGER AS world_size FROM rank_points"
)
_SCALAR = "SELECT step, value, ts AS timestamp FROM scalar_points"


def _table(kind: int) -> str:
    return "rank_points" if kind == RANK else "scalar_points"


class DuckDBExportTables:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def extent(
        self, kind: int, series_id: int, lo: float | None, hi: float | None
    ) -> tuple[float, float, int] | None:
        where, params = bounded("series_id = ?", [series_id], lo, hi)
        ((first, last, points),) = (
            self._engine.cursor()
            .execute(
                f"SELECT min(step), max(step), count(*) FROM {_table(kind)} WHERE {where}", params
            )
            .fetchall()
        )
        return None if not points else (first, last, int(points))

    def window(self, kind: int, series_id: int, lo: float, below: float) -> pa.Table:
        select, order = (_RANK, "step, rank") if kind == RANK else (_SCALAR, "step")
        # A relation's Arrow output, without the copy a DB-API result's would make.
        return (
            self._engine.cursor()
            .sql(
                f"{select} WHERE series_id = ? AND step >= ? AND step < ? ORDER BY {order}",
                params=[series_id, lo, below],
            )
            .to_arrow_table()
        )
