"""A series' points as a download: JSON, CSV, Parquet or an Arrow IPC stream, written a
window at a time from the stores' own Arrow tables (``storage/export.py``), so that a run
of any length leaves the server in bounded memory and no point passes through a Python
object on the way out in the columnar formats.

Rank points: ``step, rank, local_rank, node, value, weight, world_size``; scalars: ``step,
value, timestamp``. A non-finite value is NaN or +-inf in CSV, Parquet and Arrow, and its
mark (``"nan"``, ``"inf"``, ``"-inf"``) in JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

Format = Literal["json", "csv", "parquet", "arrow"]

RANK_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("local_rank", pa.int32()),
        ("node", pa.string()),
        ("value", pa.float64()),
        ("weight", pa.float64()),
        ("world_size", pa.int32()),
    ]
)
SCALAR_SCHEMA = pa.schema(
    [("step", pa.float64()), ("value", pa.float64()), ("timestamp", pa.float64())]
)
MEDIA_TYPES: dict[str, str] = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "parquet": "application/vnd.apache.parquet",
    "arrow": "application/vnd.apache.arrow.stream",
}
_MARKS = {np.inf: "inf", -np.inf: "-inf"}


def with_nodes(table: pa.Table, nodes: Mapping[int, str]) -> pa.Table:
    """A rank-points table with its ``node`` column: each rank's node, null if unknown."""
    if nodes:
        ranks, inverse = np.unique(table.column("rank").to_numpy(), return_inverse=True)
        names = np.array([nodes.get(int(r)) for r in ranks], dtype=object)
        column = pa.array(names[inverse], type=pa.string())
    else:
        column = pa.nulls(table.num_rows, pa.string())
    return table.add_column(3, "node", column)


class _Drain:
    """A file for pyarrow's writers whose bytes are taken out as they are written."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._written += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def _columnar(tables: Iterable[pa.Table], schema: pa.Schema, fmt: str) -> Iterator[bytes]:
    sink = _Drain()
    writer: Any
    if fmt == "parquet":
        writer = pq.ParquetWriter(sink, schema)
    elif fmt == "arrow":
        writer = pa.ipc.new_stream(sink, schema)
    else:
        writer = pa_csv.CSVWriter(sink, schema)
    for table in tables:
        writer.write_table(table.cast(schema))
        yield sink.take()
    writer.close()
    yield sink.take()


def _json(tables: Iterable[pa.Table], schema: pa.Schema, head: dict[str, Any]) -> Iterator[bytes]:
    opening = orjson.dumps({**head, "columns": schema.names})[:-1]
    yield opening + b', "points": ['
    first = True
    for table in tables:
        columns = [table.column(name).to_pylist() for name in schema.names]
        value = columns[schema.names.index("value")]
        values = table.column("value").to_numpy()
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            v = values[i]
            value[i] = "nan" if np.isnan(v) else _MARKS[v]
        if schema is SCALAR_SCHEMA:  # a scalar step is a float; whole ones read as ints
            columns[0] = [int(s) if s.is_integer() else s for s in columns[0]]
        rows = orjson.dumps(list(zip(*columns)))[1:-1]
        if rows:
            yield (b"" if first else b",") + rows
            first = False
    yield b"]}"


def stream(
    tables: Iterable[pa.Table], schema: pa.Schema, fmt: str, head: dict[str, Any]
) -> Iterator[bytes]:
    """The download's bytes, as the tables come."""
    if fmt == "json":
        return _json(tables, schema, head)
    return _columnar(tables, schema, fmt)
