"""Each role's dashboard shows what that role acts on, and the campaigns list
names the list, the times, and can be searched and duplicated from."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser, make_campaign
from tests.integration.security_fixtures import seed
from workers import queue


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


@pytest.fixture()
def seeded(app: Any, engine: sa.Engine) -> dict[str, Any]:
    ids = seed(engine, app.extensions["senddock"].config)
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, user_ref)
            VALUES ('verification', :p, 'held', 'someone@mailinator.com', 'held-user')"""),
            {"p": queue.PRIORITY["verification"]})
    return ids


def test_admin_dashboard_shows_queue_failures_relay_and_campaigns(
        client: Any, seeded: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    page = Browser(client, make_user("admin")).get("/").get_data(as_text=True)
    text = _text(page)
    assert 'id="dash-queue"' in page and 'id="dash-failures"' in page
    assert "failed or bounced, last hour" in text and "relay" in text
    assert "failed@example.org" in text and "550 5.7.1 blocked" in text
    assert 'id="dash-campaigns"' in page and "Seeded" in text
    assert 'id="dash-held"' not in page


def test_support_dashboard_shows_failed_and_held_verification_mail(
        client: Any, seeded: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    page = Browser(client, make_user("support")).get("/").get_data(as_text=True)
    text = _text(page)
    assert "Held verification emails (1)" in text and "someone@mailinator.com" in text
    assert 'href="/support/users/held-user"' in page
    assert "failed@example.org" in text and 'href="/support/users/failed-user"' in page
    assert "/campaigns/" not in page  # support cannot open campaigns: no link to them
    assert 'id="dash-queue"' not in page


def test_marketer_dashboard_is_the_campaigns(
        client: Any, seeded: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    page = Browser(client, make_user("marketer")).get("/").get_data(as_text=True)
    assert 'id="dash-campaigns"' in page and "Seeded list" in _text(page)
    assert 'id="dash-queue"' not in page and 'id="dash-held"' not in page


def test_campaigns_list_names_list_and_times_searches_and_duplicates(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    make_campaign(engine, ["a@example.org"], name="Spring sale")
    draft = make_campaign(engine, ["b@example.org"], name="Autumn news", send=False)
    browser = Browser(client, make_user("marketer"))
    text = _text(browser.get("/campaigns/").get_data(as_text=True))
    assert "Spring sale Spring sale list sending started" in text
    assert "Autumn news Autumn news list draft created" in text
    assert "not sent yet" in text  # a draft has no counters yet, not "0"
    found = _text(browser.get("/campaigns/?q=autumn").get_data(as_text=True))
    assert "Autumn news" in found and "Spring sale" not in found
    none = _text(browser.get("/campaigns/?q=zzz").get_data(as_text=True))
    assert "No campaign matches “zzz”" in none
    dup = browser.post(f"/campaigns/{draft['id']}/duplicate")
    assert "Autumn news (copy)" in dup.get_data(as_text=True)
