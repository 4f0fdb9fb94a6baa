"""An admin reads the Sending domains, Transactional and Event webhooks pages in English
and in Spanish in a real browser: the pages' own text and the messages the domain code
builds (check verdicts, fixes, flashes) are in the chosen language."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer, login
from webapp.domain import users
from webapp.i18n import LANGUAGES

pytestmark = pytest.mark.e2e
SHOTS = os.environ.get("SENDDOCK_SHOTS")  # a directory: keep a screenshot of each page

SEEN = {
    "en": {"domains": ["Sending domains", "mail is signed with it from now on", "DKIM key"],
           "transactional": ["Transactional", "verification"],
           "webhooks": ["Event webhooks", "Endpoint added. Its signing secret is shown"]},
    "es": {"domains": ["Dominios de envío", "desde ahora firma el correo de mail.example.net",
                       "Clave DKIM sd1._domainkey.mail.example.net"],
           "transactional": ["Transaccional"],
           "webhooks": ["Webhooks de eventos", "Endpoint añadido. Su secreto de firma"]},
}


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.mark.parametrize("language", ["en", "es"])
def test_the_admin_pages_in_each_language(page: Any, live_server: LiveServer,
                                          engine: sa.Engine, language: str,
                                          make_user: Callable[..., dict[str, Any]]) -> None:
    admin = make_user("admin")
    with engine.begin() as conn:
        users.set_locale(conn, admin["id"], language, allowed=LANGUAGES, actor="test")
    login(page, live_server, admin)
    seen = SEEN[language]
    page.goto(f"{live_server.url}/admin/domains")
    page.fill("input[name=domain]", "mail.example.net")
    page.locator("form[action$='/admin/domains/keys'] button[type=submit]").click()
    expect(page.locator(".flash-success")).to_be_visible()
    for text in seen["domains"]:
        expect(page.locator("body")).to_contain_text(text)
    _shot(page, f"domain-{language}")
    page.goto(f"{live_server.url}/admin/domains")
    _shot(page, f"domains-{language}")
    page.goto(f"{live_server.url}/transactional/")
    for text in seen["transactional"]:
        expect(page.locator("body")).to_contain_text(text)
    _shot(page, f"transactional-{language}")
    page.goto(f"{live_server.url}/transactional/kinds/verification")
    _shot(page, f"kind-{language}")
    page.goto(f"{live_server.url}/admin/event-webhooks/")
    page.fill("input[name=url]", "https://hooks.example.net/senddock")
    page.locator("form button[type=submit]").last.click()
    for text in seen["webhooks"]:
        expect(page.locator("body")).to_contain_text(text)
    _shot(page, f"webhooks-{language}")
