"""The write routes, once: each route's method, path, body type and the command its body
becomes. The single routes are registered from this table (``server/routes/writes.py``),
and ``/api/ingest`` routes each event through it, so an event in a batch is the same
request as when sent alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .. import unsupported
from ..errors import ApiError
from . import validate, wire
from .commands import Write

RUN = "{run_id}"


@dataclass(frozen=True, slots=True)
class WriteRoute:
    method: str
    path: str  # a template: {run_id} stands for one path segment
    name: str  # the operation's name (and OpenAPI operationId's stem)
    body: type  # the body's type (wire.py), which the OpenAPI schema documents
    build: Callable[[int, str, dict[str, Any]], Write]  # (org id, run id, body) -> command
    doc: str
    status_code: int = 200


ROUTES = (
    WriteRoute(
        "POST", "/runs", "create_run", wire.RunBody,
        lambda org_id, _, body: validate.create_run(org_id, body),
        "Create a run, or attach to it (200) when its ``id`` exists in the same project.", 201,
    ),
    WriteRoute(
        "PATCH", f"/runs/{RUN}", "patch_run", wire.PatchBody, validate.patch_run,
        "Set a run's status (``rank``: the rank that finishes).",
    ),
    WriteRoute(
        "POST", f"/runs/{RUN}/metrics", "log_scalars", wire.ScalarBody, validate.scalars,
        "Scalar metrics at a step.",
    ),
    WriteRoute(
        "POST", f"/runs/{RUN}/rank-metrics", "log_rank_metrics", wire.RankBody,
        validate.rank_points, "One rank's metrics at a global step.",
    ),
    WriteRoute(
        "POST", f"/api/runs/{RUN}/attributes", "log_attributes", wire.AttributesBody,
        validate.attributes, "Run attributes: config entries, tags, notes, health thresholds.",
    ),
    WriteRoute(
        "POST", f"/api/runs/{RUN}/logs", "log_console", wire.LogsBody, validate.logs,
        "Console lines (the public SDK's ``capture_console=True`` / ``log_console``).",
    ),
)  # fmt: skip
RANK_POINTS = ROUTES[3]
_SHAPES = {tuple(route.path.strip("/").split("/")): route for route in ROUTES}


@lru_cache(maxsize=4096)
def find(path: str) -> tuple[WriteRoute, str] | None:
    """The write route a path names, with its run id ("" for ``/runs``); None if none."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    for shape, route in _SHAPES.items():
        if len(shape) == len(parts) and all(
            s in (p, RUN) for s, p in zip(shape, parts, strict=True)
        ):
            return route, parts[shape.index(RUN)] if RUN in shape else ""
    return None


def rank_run(path: str) -> str | None:
    """The run id of a ``/runs/{run_id}/rank-metrics`` path (nothing after it), else None."""
    found = find(path)
    if found is None or found[0] is not RANK_POINTS or "?" in path:
        return None
    return found[1]


def command(org_id: int, method: str, path: str, body: dict[str, Any]) -> Write:
    """The command a (method, path, body) event stands for, as if sent to its own route;
    ApiError (404, 405, 501 for a public SDK feature this server lacks, 422) otherwise."""
    found = find(path)
    if found is None:
        if (feature := unsupported.feature_of(path)) is not None:
            raise ApiError(501, unsupported.message(feature))
        raise ApiError(404, f"request.path: no write route at {path!r}")
    route, run_id = found
    if method.upper() != route.method:
        raise ApiError(405, f"request.method: {path!r} takes {route.method}, not {method!r}")
    return route.build(org_id, run_id, body)
