"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium), never a downloaded browser.

The lab's server runs in a background thread on 127.0.0.1 and a free port. Each test gets a fresh page whose
requests to anything but that server (or a file:// page) are refused and recorded, so a test also shows that
the page needs no network. Screenshots go to artifacts/web/ (gitignored).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "artifacts" / "web"


@pytest.fixture(scope="session")
def lab_url():
    from kvlab.web.serve import serve_in_thread

    server, thread, url = serve_in_thread()
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser_context():
    if not CHROMIUM.exists():
        pytest.fail("the browser tests need Debian's Chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    user_data_dir = tempfile.mkdtemp(prefix="kvlab-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            user_data_dir,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1320, "height": 1000},
        )
        yield context
        context.close()
    shutil.rmtree(user_data_dir, ignore_errors=True)


class PageProbe:
    """A page plus what it tried to fetch from elsewhere and what it logged as an error."""

    def __init__(self, page, allowed_prefix: str | None):
        self.page = page
        self.foreign_requests: list[str] = []
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", self._console)

        def guard(route):
            url = route.request.url
            if url.startswith(("file://", "data:", "blob:")) or (allowed_prefix and url.startswith(allowed_prefix)):
                route.continue_()
            else:
                self.foreign_requests.append(url)
                route.abort()

        page.route("**/*", guard)

    def _console(self, msg) -> None:
        # Every console error counts, a refused value's "Failed to load resource: ... 400" too: the page asks for
        # refusals in the body (kvlab.web.server), so that a refused value is a line beside its control and nothing
        # more.
        if msg.type == "error":
            self.errors.append(msg.text)

    def screenshot(self, name: str, selector: str | None = None, *, full_page: bool = True) -> Path:
        """artifacts/web/NAME.png: the element ``selector`` (a section of the page), or the whole page (or, with
        ``full_page=False``, what the window shows: the first screen)."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if selector:
            self.page.locator(selector).screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture
def open_page(browser_context):
    """``open_page(url, allowed_prefix)`` -> PageProbe; the page is closed after the test."""
    pages = []

    def opener(url: str, allowed_prefix: str | None = None) -> PageProbe:
        page = browser_context.new_page()
        pages.append(page)
        probe = PageProbe(page, allowed_prefix)
        page.goto(url)
        return probe

    yield opener
    for page in pages:
        page.close()


@pytest.fixture
def lab(open_page, lab_url):
    """The lab's page, loaded and ready (catalogue fetched, grid and race runs created)."""
    probe = open_page(lab_url + "/", allowed_prefix=lab_url + "/")
    probe.page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
    yield probe
    assert probe.foreign_requests == [], "the page fetched something from outside the lab's server"
    assert probe.errors == [], f"the page logged errors: {probe.errors}"


@pytest.fixture
def lab_at(open_page, lab_url, browser_context):
    """``lab_at(width, height)`` -> PageProbe: the lab loaded in a viewport of that size (a phone, a desktop)."""
    probes = []

    def opener(width: int, height: int) -> PageProbe:
        page = browser_context.new_page()
        page.set_viewport_size({"width": width, "height": height})
        probe = PageProbe(page, lab_url + "/")
        probes.append(probe)
        page.goto(lab_url + "/")
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
        return probe

    yield opener
    for probe in probes:
        probe.page.close()
        assert probe.foreign_requests == [], "the page fetched something from outside the lab's server"
        assert probe.errors == [], f"the page logged errors: {probe.errors}"
