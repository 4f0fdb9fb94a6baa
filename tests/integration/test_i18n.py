"""English and Spanish (docs/design.md §25): the language comes from the user's own setting, else
the browser's Accept-Language; numbers and dates follow it."""

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


def test_the_page_says_its_language_in_html_lang(
        client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    """Screen readers and the browser's translation offer read ``<html lang>``: it is the
    language the page is written in, never a fixed "en"."""
    assert '<html lang="es">' in client.get("/login", headers={
        "Accept-Language": "es"}).get_data(as_text=True)
    assert '<html lang="en">' in client.get("/login", headers={
        "Accept-Language": "en"}).get_data(as_text=True)
    browser = Browser(client, make_user("support"))
    browser.post("/account/language", {"locale": "es"})
    assert '<html lang="es">' in browser.get("/", headers={
        "Accept-Language": "en"}).get_data(as_text=True)


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
    """Messages built by the domain code and the engine (workers.core.i18n.N_) are said in the
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


def test_user_suppression_inbox_and_support_errors_in_spanish(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """Refusals from webapp.domain.users, suppressions, inbox, messages and kinds reach a
    Spanish reader in Spanish (flashes, error pages, the login form, the kind editor);
    nothing of the English is left on the page."""
    admin = make_user("admin")
    client.environ_base["HTTP_ACCEPT_LANGUAGE"] = "es"
    browser = Browser(client, admin)
    # users: a password too short, then the last admin disabling themselves.
    page = _text(browser.post("/admin/users/create", {
        "email": "nuevo@example.org", "password": "corta", "role": "support"}).get_data(
        as_text=True))
    assert "la contraseña debe tener al menos 10 caracteres" in page
    assert "password must be" not in page
    page = _text(browser.post(f"/admin/users/{admin['id']}/active", {"active": "0"}
                              ).get_data(as_text=True))
    assert "es el último administrador activo; haz administrador a otro usuario primero" \
        in page and "last active admin" not in page
    # suppressions: an empty paste.
    page = _text(browser.post("/admin/suppressions/add", {"emails": "  ", "reason": "manual"}
                              ).get_data(as_text=True))
    assert "pega al menos una dirección" in page and "paste at least" not in page
    # inbox: a search that is neither an address, a correlation ID nor a job id.
    inbox = browser.get("/inbox/?q=garcia")
    assert inbox.status_code == 422
    page = _text(inbox.get_data(as_text=True))
    assert "No se buscó: «garcia» no es una dirección de correo, un ID de correlación ni " \
        "un id de trabajo completos" in page and "Not searched" not in page
    # support (webapp.domain.messages): a user without mail.
    missing = browser.get("/support/users/nadie-42")
    assert missing.status_code == 404
    assert "no hay correos para el usuario nadie-42" in _text(missing.get_data(as_text=True))
    # kinds: the editor names the bad field in Spanish, at the top and beside the field.
    page = _text(browser.post("/transactional/kinds", {
        "name": "bienvenida", "class": "lifecycle", "subject": "Hola", "text": "Hola",
        "retry_schedule": "-5", "resend_cooldown": "60", "dedupe_window": "0",
        "sample_data": "{}", "sample_event": "{}"}).get_data(as_text=True))
    assert "tipo no válido: retry_schedule: una lista de como mucho 10 esperas en " \
        "segundos (de 0 a 604800)" in page and "a list of at most" not in page


def test_the_login_refusal_in_the_browsers_language(client: Any,
                                                     make_user: Callable[..., Any]) -> None:
    user = make_user("support")
    token = re.search(r'name="csrf_token" value="([^"]+)"',
                      client.get("/login").get_data(as_text=True))
    assert token
    refused = client.post("/login", data={"email": user["email"], "password": "not it",
                                          "csrf_token": token[1]}, headers=ES)
    assert refused.status_code == 401
    assert "Correo o contraseña incorrectos." in _text(refused.get_data(as_text=True))


def test_the_api_keeps_the_same_refusals_in_english(client: Any, api: Any) -> None:
    """The JSON API is a contract: the messages the Spanish pages translate stay English
    there, whatever Accept-Language says."""
    headers = {**api.headers, "Accept-Language": "es"}
    kind = client.put("/api/v1/kinds/bienvenida", headers=headers, json={
        "class": "lifecycle", "subject": "Hola", "text": "Hola", "retry_schedule": [-5]})
    assert kind.status_code == 422
    assert kind.get_json()["error"]["message"] == (
        "invalid kind: retry_schedule: a list of at most 10 delays in seconds (0 to 604800); "
        "[] means never retry")
    assert kind.get_json()["error"]["fields"]["retry_schedule"].startswith("a list of")
    listed = client.get("/api/v1/suppressions?reason=porque", headers=headers)
    assert listed.status_code == 422
    assert listed.get_json()["error"]["message"].startswith("reason must be one of ")
    resend = client.post("/api/v1/messages/resend", headers=headers,
                         json={"kind": "verification", "user_id": "nadie-42"})
    assert resend.status_code == 404
    assert resend.get_json()["error"]["message"] == (
        "no verification email was ever requested for user nadie-42")


def test_error_classes_and_cancellations_are_said_in_spanish(
        app: Any, client: Any, engine: sa.Engine) -> None:
    """Stored words (an error class, "cancelled by …" that SendDock wrote) reach a Spanish
    page in Spanish; a relay's own reply stays as the relay said it."""
    from webapp.i18n import job_note, label
    with app.test_request_context("/", headers={"Accept-Language": "es"}):
        assert label("hard_bounce") == "rebote definitivo"
        assert label("domain_throttle") == "límite del dominio"
        assert job_note("cancelled by ana@example.com") == "cancelado por ana@example.com"
        assert job_note("550 5.1.1 no such user") == "550 5.1.1 no such user"
        assert job_note(None) == ""
    with app.test_request_context("/", headers={"Accept-Language": "en"}):
        assert job_note("cancelled by ana@example.com") == "cancelled by ana@example.com"


def test_the_dashboards_failure_card_links_a_date_the_inbox_reads_in_spanish(
        client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    """A date inside a link is data (ISO), not text: the Spanish dashboard's card once
    linked 01/12/2026 and the inbox answered 422."""
    browser = Browser(client, make_user("admin"))
    page = browser.get("/", headers=ES).get_data(as_text=True)
    link = unescape(re.search(r'href="(/inbox/\?from=[^"]+)"', page)[1])  # type: ignore[index]
    assert re.fullmatch(r"/inbox/\?from=\d{4}-\d\d-\d\d", link), link
    assert browser.get(link, headers=ES).status_code == 200
