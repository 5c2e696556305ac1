"""JSON responses rendered by orjson: fast, NaN and +-inf written as null, numpy arrays
written as lists (a summary's heatmap grid goes out without a Python float per cell)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
