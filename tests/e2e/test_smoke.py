"""The live server starts, the login works, the dashboard shows campaigns with live counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from tests.helpers import make_campaign


def test_login_and_dashboard_counts_reach_final_values(
        page: Any, live_server: LiveServer, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    make_campaign(engine, [f"s{i}@example.org" for i in range(30)], name="Smoke campaign")
    login(page, live_server, user)
    page.goto(live_server.url + "/")
    assert page.get_by_role("link", name="Smoke campaign").is_visible()
    # The table polls itself: the status reaches "sent" without a reload.
    page.locator("#campaign-table .badge-sent").wait_for(timeout=30_000)
    row = page.locator("#campaign-table tr", has_text="Smoke campaign")
    assert "30" in row.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)


def test_wrong_password_is_refused(page: Any, live_server: LiveServer,
                                   make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("support")
    page.goto(live_server.url + "/login")
    page.fill("input[name=email]", user["email"])
    page.fill("input[name=password]", "not the password")
    page.click("button[type=submit]")
    assert page.locator("text=Wrong email or password").is_visible()
