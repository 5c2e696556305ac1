"""A real headless Chromium (Debian's), driven by Playwright, against the real server."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("INSTANTML_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(
    os.environ.get("INSTANTML_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
# Without the background-networking flags Chromium tries to reach Google at every start.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Module scope: Playwright's sync API keeps an event loop running while it is open, which
# would stop later tests from calling asyncio.run.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 1600})  # type: ignore[attr-defined]
    page = context.new_page()
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda error: page.errors.append(f"pageerror: {error}"))  # type: ignore[attr-defined]
    page.on(
        "console", lambda m: page.errors.append(f"console: {m.text}") if m.type == "error" else None
    )  # type: ignore[attr-defined]
    page.on("dialog", lambda d: (page.errors.append(f"dialog: {d.message}"), d.dismiss()))  # type: ignore[attr-defined]
    yield page
    context.close()


def shot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


def wait_until(page: object, expression: str, timeout: float = 30.0) -> None:
    """Poll a JavaScript expression until it is true. (Playwright's wait_for_function
    compiles its predicate with eval in the page, which the dashboard's CSP refuses;
    evaluate goes through the debugger protocol, which the CSP does not govern.)"""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.05)
