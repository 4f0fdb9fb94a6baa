"""Every page as each role, in English and Spanish, at 1280 and 390 px, in Chromium, over
the demo's data (webapp.demo.seed): no page answers 500, no Spanish page shows an English
fragment of the catalogue (tests/integration/test_spanish_pages.py), and at 390 px no page's
content is wider than the window (``scrollWidth > innerWidth``: a table must scroll inside
its own box, not push the page sideways). Pages are found by following links from the
dashboard, at most ``SENDDOCK_WALK_PAGES`` per role (bounded by count). With
``SENDDOCK_SHOTS`` set to a directory, a full-page PNG of each page is kept there."""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer, login
from tests.integration.test_link_crawl import _links
from tests.integration.test_spanish_pages import english_in
from webapp import demo
from webapp.domain import users
from webapp.i18n import LANGUAGES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SHOTS = os.environ.get("SENDDOCK_SHOTS")
MAX_PAGES = int(os.environ.get("SENDDOCK_WALK_PAGES", "40"))
PASSWORD = "walk-the-pages-1"
WIDTHS = (1280, 390)
# Links that change something on GET or leave the UI (downloads, the demo's sink).
SKIP = re.compile(r"/export\.csv|\.csv$|/download|/logout")


def _walk(page: Any, base: str) -> list[str]:
    """The pages reachable from the dashboard, breadth first, at most MAX_PAGES."""
    seen: list[str] = []
    queue: deque[str] = deque(["/"])
    while queue and len(seen) < MAX_PAGES:
        path = queue.popleft()
        if path in seen or SKIP.search(path):
            continue
        seen.append(path)
        answer = page.goto(base + path)
        if answer is not None and answer.ok and "text/html" in answer.headers.get(
                "content-type", ""):
            # Same-origin links, as the crawl of the test client reads them (its host).
            html = page.content().replace(f'href="{base}', 'href="')
            queue.extend(p for p in _links("http://localhost" + path, html) if p not in seen)
    return seen


def _name(role: str, language: str, width: int, path: str) -> str:
    slug = re.sub(r"[^a-zA-Z0-9]+", "_", path).strip("_") or "dashboard"
    return f"{role}-{language}-{width}-{slug[:80]}"


@pytest.mark.parametrize("language", ["en", "es"])
@pytest.mark.parametrize("role", ["admin", "marketer", "support"])
def test_every_page_as_each_role(browser: Any, live_server: LiveServer, engine: sa.Engine,
                                 role: str, language: str) -> None:
    with engine.begin() as conn:
        demo.seed(conn, 200, PASSWORD)
        email = next(e for e, r in demo.DEMO_USERS.items() if r == role)
        found = users.find_user(conn, email)
        assert found is not None
        users.set_locale(conn, int(found["id"]), language, allowed=LANGUAGES, actor="test")
    problems: list[str] = []
    pages: list[str] = []
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        login(page, live_server, {"email": email, "password": PASSWORD})
        if not pages:
            pages = _walk(page, live_server.url)
        for path in pages:
            answer = page.goto(live_server.url + path)
            status = answer.status if answer is not None else 0
            if status >= 500:
                problems.append(f"{path}: {status}")
                continue
            if language == "es" and (english := english_in(page.content())):
                problems.append(f"{path}: English in a Spanish page: {english[:3]}")
            if width < 1000:
                wide = page.evaluate(
                    "[document.documentElement.scrollWidth, window.innerWidth]")
                if wide[0] > wide[1]:
                    problems.append(f"{path}: {wide[0]} px wide in a {wide[1]} px window")
            if SHOTS:
                Path(SHOTS).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(SHOTS) / f"{_name(role, language, width, path)}"
                                         ".png"), full_page=True)
        context.close()
    assert len(pages) >= 5, pages  # the walk found the UI, not just the dashboard
    assert not problems, "\n".join(problems)
