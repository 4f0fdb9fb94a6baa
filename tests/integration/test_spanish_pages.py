"""No English inside Spanish pages, found by reading the pages, not the code.

The English side of the catalog is the list of what must not be seen (harness/pages.py):
every message that has a Spanish translation different from itself is cut at its
placeholders, and each piece of three words or more is an English fragment. Each role
crawls the UI in Spanish over a database with one of everything (a campaign with bounces,
a cancelled one, a failing event webhook, a retrying job, a held one...), and every page's
visible text and text attributes (title, placeholder, aria-label, data-confirm) must
contain none of them. Server messages shown after a form (flashes, errors) are checked the
same way in the form tests (tests/integration/test_forms_keep_input.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
import sqlalchemy as sa

from harness.pages import english_fragments, english_in
from tests.helpers import Browser, place_jobs
from tests.integration.security_fixtures import ROLES, failed_job, seed
from tests.integration.test_link_crawl import _links
from workers.after_acceptance import event_queue
from workers.after_acceptance.event_webhooks import new_secret

MAX_PAGES = 250
# Words that are the same in both languages or are data, not UI (kept short on purpose).
SAME_IN_BOTH = {"SendDock", "DKIM", "SPF", "DMARC", "HTML", "CSV", "API", "SMTP", "URL"}


def test_the_fragment_list_finds_english() -> None:
    assert len(english_fragments()) > 500
    assert english_in("<p>Failed and bounced messages of every kind, newest first.</p>")
    assert not english_in("<p>Mensajes fallidos y rebotados de todo tipo.</p>")


@pytest.fixture()
def everything(app: Any, engine: sa.Engine) -> dict[str, Any]:
    """One of everything, plus what was once found untranslated: a cancelled campaign, a
    failing and a disabled event webhook, retrying and failed jobs of each class."""
    from tests.helpers import make_campaign
    from webapp.domain import campaigns

    ids = seed(engine, app.extensions["senddock"].config)
    cancelled = make_campaign(engine, [f"c{i}@example.org" for i in range(5)],
                              name="Cancelled one")
    with engine.begin() as conn:
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'bounced', attempts = 1, finished_at = now(),
                   last_error = '550 5.1.1 no such user', last_error_class = 'hard_bounce'
             WHERE campaign_id = :c"""), {"c": ids["campaign_id"]})
        for reply, cls in (("554 5.7.1 spam", "rejected"), ("451 4.3.0 later", "transient"),
                           ("template error", "build")):
            job = failed_job(conn, f"{cls}@example.org", reply)
            conn.execute(sa.text("UPDATE delivery_jobs SET last_error_class = :k "
                                 "WHERE id = :j"), {"k": cls, "j": job})
        campaigns.cancel(conn, cancelled["id"], actor="tests")
        for url, since in (("https://hooks.example.com/a?token=x", "2 hours"),
                           ("https://hooks.example.com/b", "4 days")):
            endpoint = event_queue.create_endpoint(conn, url=url, secret=new_secret(),
                                                   events=["sent", "bounced"])
            conn.execute(sa.text(
                "UPDATE webhook_endpoints SET failing_since = now() - CAST(:s AS interval), "
                "consecutive_failures = 30, last_attempt_at = now(), last_status = 503 "
                "WHERE id = :e"), {"s": since, "e": endpoint})
        conn.execute(sa.text("UPDATE webhook_endpoints SET disabled_at = now(), "
                             "disabled_reason = 'HTTP 503' WHERE url LIKE '%/b'"))
    return ids


def crawl_in_spanish(browser: Browser) -> tuple[dict[str, list[str]], int]:
    seen: set[str] = set()
    problems: dict[str, list[str]] = {}
    todo: deque[str] = deque(["/"])
    while todo and len(seen) < MAX_PAGES:
        url = todo.popleft()
        if url in seen:
            continue
        seen.add(url)
        answer = browser.get(url, headers={"Accept-Language": "es"}, follow_redirects=True)
        if answer.status_code != 200 or "text/html" not in answer.content_type:
            continue
        html = answer.get_data(as_text=True)
        found = english_in(html)
        if found:
            problems[url] = found
        for link in _links(url, html):
            # One page of a kind is enough: skip the pager's and the filters' variants.
            if link not in seen and "after=" not in link and "/static" not in link:
                todo.append(link)
    return problems, len(seen)


@pytest.mark.parametrize("role", ROLES)
def test_no_english_on_any_spanish_page(app: Any, make_user: Any, everything: Any,
                                        role: str) -> None:
    from webapp.domain import health

    health._alarm_cache.clear()
    browser = Browser(app.test_client(), make_user(role))
    problems, pages = crawl_in_spanish(browser)
    assert pages > 10
    where: dict[str, list[str]] = {}
    for url, found in sorted(problems.items()):
        for fragment in found:
            where.setdefault(fragment, []).append(url)
    assert not where, "English on Spanish pages:\n" + "\n".join(
        f"{fragment!r} on {urls[:3]}" for fragment, urls in sorted(where.items()))
