"""JSON responses rendered by orjson (fast, and refuses NaN by writing null)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
