"""No page links to a page its viewer may not open.

Each role logs in and crawls the UI from the dashboard, following every same-site link
(``href``) of every page it reaches, over a database seeded with one of everything plus a
campaign with failures. Every link must answer 200 (or a redirect to a page that does):
a 403, a 404 or a 500 behind a link is a lie the page told.
"""

from __future__ import annotations

import re
from collections import deque
from html import unescape
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import sqlalchemy as sa

from tests.helpers import place_jobs
from tests.integration.security_fixtures import ROLES, failed_job, login, seed

HREF = re.compile(r'\bhref="([^"]*)"')
MAX_PAGES = 400
SKIP = ("/static/", "/logout", "/api/", "/metrics", "/u/")


def _links(base: str, html: str) -> list[str]:
    found = []
    for raw in HREF.findall(html):
        url = urljoin(base, unescape(raw))
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            continue
        if any(parts.path.startswith(s) for s in SKIP):
            continue
        found.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    return found


def crawl(client: Any, start: str = "/") -> tuple[dict[str, int], list[str]]:
    """Every page reachable from ``start`` -> its status; and the broken links found
    ("page -> link: status")."""
    seen: dict[str, int] = {}
    broken: list[str] = []
    queue: deque[tuple[str, str]] = deque([("(start)", start)])
    while queue and len(seen) < MAX_PAGES:
        source, url = queue.popleft()
        if url in seen:
            if seen[url] != 200:
                broken.append(f"{source} -> {url}: {seen[url]}")
            continue
        answer = client.get(url, follow_redirects=True)
        seen[url] = answer.status_code
        if answer.status_code != 200:
            broken.append(f"{source} -> {url}: {answer.status_code}")
            continue
        if answer.request.path.startswith("/login"):
            broken.append(f"{source} -> {url}: sent to the login page")
            continue
        if "text/html" not in answer.content_type:
            continue
        for link in _links(url, answer.get_data(as_text=True)):
            if link not in seen:
                queue.append((url, link))
    return seen, broken


@pytest.fixture()
def seeded(app: Any, engine: sa.Engine) -> dict[str, Any]:
    ids = seed(engine, app.extensions["senddock"].config)
    with engine.begin() as conn:  # the seeded campaign also has a bounce and a failure
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'bounced', attempts = 1, finished_at = now(),
                   last_error = '550 5.1.1 no such user', last_error_class = 'hard_bounce'
             WHERE campaign_id = :c"""), {"c": ids["campaign_id"]})
        ids["other_failed"] = failed_job(conn, "other@example.org", "554 5.7.1 spam")
    return ids


@pytest.mark.parametrize("role", ROLES)
def test_every_link_opens_for_its_viewer(app: Any, seeded: dict[str, Any],
                                         make_user: Any, role: str) -> None:
    client = app.test_client()
    login(client, make_user(role))
    seen, broken = crawl(client)
    assert not broken, "\n".join(broken)
    assert len(seen) > 5, seen  # it did crawl
    if role == "marketer":
        assert any(u.startswith(f"/campaigns/{seeded['campaign_id']}/failures")
                   for u in seen), sorted(seen)


def test_a_marketer_sees_their_campaigns_failures_read_only(
        app: Any, seeded: dict[str, Any], make_user: Any) -> None:
    client = app.test_client()
    login(client, make_user("marketer"))
    page = client.get(f"/campaigns/{seeded['campaign_id']}/failures").get_data(as_text=True)
    assert "seeded@example.org" in page and "550 5.1.1 no such user" in page
    assert "hard bounce" in page
    assert "other@example.org" not in page  # only this campaign's
    assert "/retry" not in page and "/dismiss" not in page  # no admin actions
    assert client.get("/inbox/").status_code == 403
