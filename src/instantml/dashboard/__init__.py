"""The dashboard: static files served by the server at ``/``, charts by the plotly.js that
the ``plotly`` wheel ships (nothing downloaded at run time, nothing built at install)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(str(resources.files(__package__) / "static"))


def _plotly_js() -> Path:
    try:
        import plotly
    except ImportError as exc:  # pragma: no cover - the server extra brings it
        raise RuntimeError("the dashboard needs plotly: pip install 'instantml[server]'") from exc
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def install(app: FastAPI) -> None:
    plotly_js = _plotly_js()
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @router.get("/static/vendor/plotly.min.js")
    async def plotly() -> FileResponse:
        return FileResponse(
            plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
        )

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
