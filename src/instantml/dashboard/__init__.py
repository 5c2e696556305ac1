"""The dashboard: static files served by the server at ``/``, charts by plotly.js (nothing
downloaded at run time, nothing built at install).

plotly.js comes from the ``plotly`` wheel (the full bundle, slow to load on a slow
machine) unless ``INSTANTML_PLOTLY_JS`` names a lighter bundle, such as the npm package
``plotly.js-cartesian-dist-min`` (every trace the dashboard draws, and less to load), which
``scripts/setup.sh`` installs when npm is there."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(str(resources.files(__package__) / "static"))

# No inline script, no script or connection but the server's own: a key name or run name
# that slipped past escaping still could not run. plotly.js sets inline styles on its SVG.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none';"
    " frame-ancestors 'none'; form-action 'self'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the sign-in link's token never leaves in a Referer
}


def _plotly_js(configured: Path | None) -> Path:
    if configured is not None:
        if not configured.is_file():
            raise RuntimeError(f"INSTANTML_PLOTLY_JS: no file at {configured}")
        return configured
    try:
        import plotly
    except ImportError as exc:  # pragma: no cover - the server extra brings it
        raise RuntimeError("the dashboard needs plotly: pip install 'instantml[server]'") from exc
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def install(app: FastAPI) -> None:
    plotly_js = _plotly_js(app.state.settings.plotly_js)
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    @router.get("/static/vendor/plotly.min.js")
    async def plotly() -> FileResponse:
        return FileResponse(
            plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
        )

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
