"""English and Spanish (SPEC 14): the language comes from the user's own setting, else the
browser's Accept-Language; numbers and dates follow it."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, make_campaign


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_the_browser_language_decides_before_login(client: Any) -> None:
    spanish = client.get("/login", headers={"Accept-Language": "es-ES,es;q=0.9,en;q=0.5"})
    assert "Inicia sesión en SendDock" in spanish.get_data(as_text=True)
    english = client.get("/login", headers={"Accept-Language": "en-GB"})
    assert "Log in to SendDock" in english.get_data(as_text=True)
    other = client.get("/login", headers={"Accept-Language": "de"})
    assert "Log in to SendDock" in other.get_data(as_text=True)


def test_the_users_setting_wins_and_numbers_and_dates_follow(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, [f"r{i}@example.org" for i in range(3)], name="Otoño")
    browser = Browser(client, make_user("admin"))
    english = _text(browser.get("/", headers={"Accept-Language": "en"}).get_data(as_text=True))
    assert "Dashboard" in english and "Recent campaigns" in english
    saved = browser.post("/account/language", {"locale": "es"})
    assert "Idioma guardado." in saved.get_data(as_text=True)
    page = _text(browser.get("/", headers={"Accept-Language": "en"}).get_data(as_text=True))
    assert "Panel" in page and "Campañas recientes" in page and "Recent campaigns" not in page
    assert re.search(r"creada el \d\d/\d\d/\d{4} \d\d:\d\d UTC|empezó el \d\d/\d\d/\d{4}", page)
    health = _text(browser.get("/health/").get_data(as_text=True))
    assert "de un máximo de 5.000.000" in health  # the default backlog limit, es-formatted
    live = _text(browser.get(f"/campaigns/{campaign['id']}").get_data(as_text=True))
    assert "Duplicar como borrador nuevo" in live and "enviando" in live
    browser.post("/account/language", {"locale": ""})  # back to the browser's choice
    assert "Recent campaigns" in _text(browser.get("/", headers={
        "Accept-Language": "en"}).get_data(as_text=True))
