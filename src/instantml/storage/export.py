"""A series' stored points read out as Arrow tables, in step windows of bounded size.

Each point engine answers two narrow reads (``ExportTables``): the extent of a step range
(first step, last step, points) and the points of one window of steps, already as an
Arrow table from the engine's own columnar output. :func:`tables` walks the range window
by window, so a run of any length leaves the store in bounded memory, and each window is
a short read of its own (no snapshot held while a client downloads).

Columns, in order: rank points ``step, rank, local_rank, value, weight, world_size`` (the
route adds each rank's ``node``); scalars ``step, value, timestamp``. A non-finite value
is the float itself (NaN, +-inf); a missing ``local_rank`` is null.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

RANK_COLUMNS = ("step", "rank", "local_rank", "value", "weight", "world_size")
SCALAR_COLUMNS = ("step", "value", "timestamp")
WINDOW_POINTS = 262_144  # points per window read: a few MB of columns


class ExportTables(Protocol):
    def extent(
        self, kind: int, series_id: int, lo: float | None, hi: float | None
    ) -> tuple[float, float, int] | None:
        """``(first step, last step, points)`` of the series within ``[lo, hi]`` (a bound
        of None: open); None when it has no point there."""
        ...

    def window(self, kind: int, series_id: int, lo: float, below: float) -> pa.Table:
        """The points with ``lo <= step < below``, by step then rank."""
        ...


def bounded(
    where: str, params: list[Any], lo: float | None, hi: float | None, mark: str = "?"
) -> tuple[str, list[Any]]:
    """``where`` with the step bounds given (``mark``: the engine's parameter marker)."""
    if lo is not None:
        where, params = f"{where} AND step >= {mark}", [*params, lo]
    if hi is not None:
        where, params = f"{where} AND step <= {mark}", [*params, hi]
    return where, params


def windows(
    first: float, last: float, points: int, per_window: int
) -> Iterator[tuple[float, float]]:
    """Half-open step windows ``[lo, below)`` covering ``[first, last]``, each expected to
    hold about ``per_window`` points if the points are spread evenly over the steps."""
    span = last - first + 1
    width: float = max(1.0, span * per_window / max(points, 1))
    if isinstance(first, int) and isinstance(last, int):  # integer steps: integer windows
        width = int(width)
    lo = first
    while lo <= last:
        below = min(lo + width, last + 1)
        yield lo, below
        lo = below


def tables(
    reader: ExportTables,
    kind: int,
    series_id: int,
    lo: float | None,
    hi: float | None,
    per_window: int = WINDOW_POINTS,
) -> Iterator[pa.Table]:
    """The series' points within ``[lo, hi]``, a window at a time (nothing when none)."""
    extent = reader.extent(kind, series_id, lo, hi)
    if extent is None:
        return
    first, last, points = extent
    for start, below in windows(first, last, points, per_window):
        table = reader.window(kind, series_id, start, below)
        if table.num_rows:
            yield table
