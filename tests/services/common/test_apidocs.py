"""``/docs`` and ``/redoc`` work offline: a real gateway's pages in headless Chromium load
nothing from outside the gateway and render its operations."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.test_docs import CHROMIUM, CHROMIUM_FLAGS


def test_pages_reference_only_the_service(gateway_url: str) -> None:
    for path, asset in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        page = httpx.get(gateway_url + path, timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "https://" not in page.text and "http://" not in page.text, page.text
        assert f"/docs/assets/{asset}" in page.text
        js = httpx.get(f"{gateway_url}/docs/assets/{asset}", timeout=10)
        assert js.status_code == 200 and len(js.content) > 100_000
    # the assets are not operations of the API
    schema = httpx.get(gateway_url + "/openapi.json", timeout=10).json()
    assert not any(p.startswith(("/docs", "/redoc")) for p in schema["paths"])


@pytest.mark.parametrize(
    ("path", "rendered"),
    [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id^='operation']")],
    ids=["swagger", "redoc"],
)
def test_pages_render_in_chromium_offline(gateway_url: str, path: str, rendered: str) -> None:
    from playwright.sync_api import Request, sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: `make test` installs Debian's chromium"
    problems: list[str] = []

    def finished(r: Request) -> None:  # loaded from outside (CSP blocks ReDoc's logo)
        if not r.url.startswith((gateway_url, "data:", "blob:")):
            problems.append(f"off-site request {r.url}")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.on("requestfinished", finished)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(gateway_url + path, wait_until="load")
        page.wait_for_selector(rendered, timeout=30_000)
        operations = page.locator(rendered).count()
        browser.close()
    assert problems == [], problems
    assert operations >= 3, f"{path}: {operations} operations rendered"
