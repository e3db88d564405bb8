"""``/docs`` (Swagger UI) and ``/redoc`` served offline: every asset from the service itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and ReDoc's fonts from Google),
so on a machine without internet they are blank. The assets ship in the
``fastapi-offline`` package (its ``static/`` folder: swagger-ui-bundle.js, swagger-ui.css,
redoc.standalone.js, favicon.png); here they are served under ``/docs/assets/`` and the
pages point at them. ReDoc's sidebar still shows its maker's logo from a CDN; the pages'
Content-Security-Policy keeps the browser on the service (images, scripts, fetches), so
nothing leaves the machine and an offline page has nothing to wait for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS = "/docs/assets"
# the inline script of each page starts the UI; ReDoc runs its search in a blob: worker
POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


def add_api_docs(app: FastAPI) -> None:
    """Routes ``/docs`` and ``/redoc`` on ``app`` (built with ``docs_url=None,
    redoc_url=None``), their assets from the package, none in the OpenAPI schema."""
    static = files("fastapi_offline") / "static"
    app.mount(ASSETS, StaticFiles(directory=str(static)), name="api-docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    # each page's HTML, made per request as FastAPI's own routes make it
    pages: dict[str, Callable[[], HTMLResponse]] = {
        "/docs": lambda: get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        ),
        "/redoc": lambda: get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        ),
    }
    for path, page in pages.items():
        app.add_api_route(path, _local(page), methods=["GET"], include_in_schema=False)


def _local(page: Callable[[], HTMLResponse]) -> Callable[[], Awaitable[HTMLResponse]]:
    """The route serving ``page`` under the policy that keeps the browser on the service."""

    async def serve() -> HTMLResponse:
        response = page()
        response.headers["Content-Security-Policy"] = POLICY
        return response

    return serve
