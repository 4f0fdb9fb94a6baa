"""A person's data on request in a real browser, in English and Spanish (docs/privacy.md):
an admin downloads everything about an address as JSON, then erases it; the address is
gone from support search, the list's members and the jobs browser, while its suppression
holds: added to a list again, it is suppressed at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer, login
from tests.integration.security_fixtures import failed_job, seed
from webapp.domain import lists, suppressions, users
from workers.core.settings import load

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PASSWORD = "personal-data-journey-1"


@pytest.mark.parametrize("language", ["en", "es"])
def test_export_then_erase(browser: Any, live_server: LiveServer, engine: sa.Engine,
                           tmp_path: Path, language: str) -> None:
    address = f"pat-{language}@example.org"
    ids = seed(engine, load(live_server.settings), email=address)
    with engine.begin() as conn:
        failed_job(conn, address, f"550 5.1.1 <{address}> unknown user")
        suppressions.suppress(conn, address, "bounced", actor="tests")
        admin = users.create_user(conn, f"dpo-{language}@example.com", PASSWORD, "admin")
        users.set_locale(conn, int(admin["id"]), language, allowed=("en", "es"), actor="t")
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    login(page, live_server, {"email": admin["email"], "password": PASSWORD})
    page.goto(f"{live_server.url}/admin/personal-data")
    export = page.locator("form[action$='/personal-data/export']")
    export.locator("input[name=email]").fill(address.upper())
    with page.expect_download() as download:
        export.locator("button[type=submit]").click()
    saved = tmp_path / "export.json"
    download.value.save_as(saved)
    data = json.loads(saved.read_text())
    assert data["subscriber"]["email"] == address
    assert data["suppressions"][0]["reason"] == "bounced" and data["jobs"]
    # Erase: the confirmation must match.
    erase = page.locator("form[action$='/personal-data/erase']")
    erase.locator("input[name=email]").fill(address)
    erase.locator("input[name=confirm]").fill(address)
    with page.expect_navigation():
        erase.locator("button[type=submit]").click()
    said = {"en": "Erased: 1 subscriber", "es": "Borrado: 1 suscriptor"}[language]
    assert said in page.inner_text("main")
    # Support search and the jobs browser echo what was searched; no row has it.
    for path in (f"/support/?q={address}", f"/jobs/?q={address}"):
        page.goto(f"{live_server.url}{path}")
        rows = page.locator("main table tbody tr")
        assert all(address not in rows.nth(i).inner_text() for i in range(rows.count())), path
    page.goto(f"{live_server.url}/lists/{ids['list_id']}")
    assert address not in page.inner_text("main")
    with engine.begin() as conn:  # it comes back: suppressed again at once
        lists.add_member(conn, ids["list_id"], address, actor="tests")
        reason = conn.execute(sa.text("SELECT reason FROM suppressions WHERE email = :e"),
                              {"e": address}).scalar()
    assert reason == "bounced"
    context.close()
