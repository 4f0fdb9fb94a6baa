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


ES = {"Accept-Language": "es"}


def test_domain_errors_show_in_spanish_on_spanish_pages(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """Messages built by the domain code and the engine (workers.i18n.N_) are said in the
    page's language; the API keeps its English contract."""
    sending = make_campaign(engine, ["a@example.org"], name="En marcha")
    marketer = make_user("marketer")
    browser = Browser(client, marketer)
    values = {"name": "Otra", "list_id": sending["list_id"], "subject": "Hola",
              "from": "news@example.com", "text": "Hola"}
    client.environ_base["HTTP_ACCEPT_LANGUAGE"] = "es"
    # Saved while it was being sent: the conflict in Spanish, the state word too.
    page = _text(browser.post(f"/campaigns/{sending['id']}/edit", values).get_data(as_text=True))
    assert "la campaña está en estado «enviando»; solo se pueden editar los borradores" in page
    assert "only drafts can be edited" not in page
    # A From with a line break: the field named in Spanish, on the field and at the top.
    new = browser.post("/campaigns/new", {**values, "from": "news@example.com\r\nBcc: x@y.z"})
    assert new.status_code == 422
    text = _text(new.get_data(as_text=True))
    assert "el campo remitente no puede contener saltos de línea" in text
    assert "contiene el carácter de control U+000D" in text
    assert "must not contain" not in text
    # A template over a limit: the limit and its numbers as Spanish writes them.
    huge = browser.post("/campaigns/new", {**values, "text": "{{ name }}" * 5_001})
    text = _text(huge.get_data(as_text=True))
    assert "Error de plantilla en texto: la plantilla tiene 5.001 etiquetas; se permiten " \
        "como máximo 5.000 nodos de plantilla (límite: nodos de plantilla)" in text, text
    assert "template nodes" not in text and "tags; at most" not in text
    # The API says the same in English whatever the browser asks for.
    api = client.post(f"/api/v1/campaigns/{sending['id']}/send", headers={
        "Authorization": f"Bearer {marketer['token']}", "Accept-Language": "es"})
    assert api.status_code == 409
    assert api.get_json()["error"]["message"] == "campaign is already sending"


def test_the_error_page_speaks_spanish(client: Any,
                                       make_user: Callable[..., dict[str, Any]]) -> None:
    browser = Browser(client, make_user("admin"))
    missing = browser.get("/campaigns/999999", headers=ES)
    assert missing.status_code == 404
    text = _text(missing.get_data(as_text=True))
    assert "No se pudo hacer" in text and "la campaña 999999 no existe" in text
    assert "does not exist" not in text
