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
           "domains_list": ["SENDDOCK_FROM (verification and transactional mail)",
                            "RSA-2048 (verified everywhere)", "sd1 · rsa · active"],
           "transactional": ["Transactional", "verification"],
           "webhooks": ["Event webhooks", "Endpoint added. Its signing secret is shown"]},
    "es": {"domains": ["Dominios de envío", "desde ahora firma el correo de mail.example.net",
                       "Clave DKIM sd1._domainkey.mail.example.net"],
           "domains_list": ["SENDDOCK_FROM (correo de verificación y transaccional)",
                            "RSA-2048 (la aceptan todos)", "la siguiente en espera: publica",
                            "sd1 · rsa · activa"],
           "transactional": ["Transaccional"],
           "webhooks": ["Webhooks de eventos", "Endpoint añadido. Su secreto de firma"]},
}


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def _sees(page: Any, texts: list[str], shot: str) -> None:
    """The page shows every one of ``texts`` (and is kept as ``shot`` with SENDDOCK_SHOTS)."""
    for text in texts:
        expect(page.locator("body")).to_contain_text(text)
    _shot(page, shot)


def _as_admin(page: Any, live_server: LiveServer, engine: sa.Engine, language: str,
              make_user: Callable[..., dict[str, Any]]) -> None:
    admin = make_user("admin")
    with engine.begin() as conn:
        users.set_locale(conn, admin["id"], language, allowed=LANGUAGES, actor="test")
    login(page, live_server, admin)


@pytest.mark.parametrize("language", ["en", "es"])
def test_the_admin_pages_in_each_language(page: Any, live_server: LiveServer,
                                          engine: sa.Engine, language: str,
                                          make_user: Callable[..., dict[str, Any]]) -> None:
    _as_admin(page, live_server, engine, language, make_user)
    seen = SEEN[language]
    page.goto(f"{live_server.url}/admin/domains")
    page.fill("input[name=domain]", "mail.example.net")
    page.locator("form[action$='/admin/domains/keys'] button[type=submit]").click()
    expect(page.locator(".flash-success")).to_be_visible()
    _sees(page, seen["domains"], f"domain-{language}")
    page.goto(f"{live_server.url}/admin/domains")
    _sees(page, seen["domains_list"], f"domains-{language}")
    page.goto(f"{live_server.url}/transactional/")
    _sees(page, seen["transactional"], f"transactional-{language}")
    page.goto(f"{live_server.url}/admin/event-webhooks/")
    page.fill("input[name=url]", "https://hooks.example.net/senddock")
    page.locator("form button[type=submit]").last.click()
    _sees(page, seen["webhooks"], f"webhooks-{language}")


# What the kind editor says, and what it says when a save is refused.
EDITOR = {
    "en": {"title": "Kind verification", "class": "critical — served first",
           "labels": ["Retry schedule", "Resend cooldown", "Dedupe window", "Sample data",
                      "Send a test"],
           "schedule": ["Not saved:", "invalid kind: retry_schedule: a list of at most 10 "
                        "delays in seconds (0 to 604800); [] means never retry",
                        "Nothing you typed was lost"],
           "schedule_field": "a list of at most 10 delays in seconds",
           "template": "the subject template has an error: line 1:",
           "list": ["critical", "Dedupe window", "none"]},
    "es": {"title": "Tipo verification", "class": "crítico — se atiende primero",
           "labels": ["Calendario de reintentos", "Espera para reenviar",
                      "Ventana de deduplicación", "Datos de ejemplo", "Enviar una prueba"],
           "schedule": ["No se guardó:", "tipo no válido: retry_schedule: una lista de como "
                        "mucho 10 esperas en segundos (de 0 a 604800); [] significa no "
                        "reintentar nunca", "No se perdió nada de lo que escribiste"],
           "schedule_field": "una lista de como mucho 10 esperas en segundos",
           "template": "error en la plantilla de asunto: línea 1:",
           "list": ["crítico", "Ventana de deduplicación", "ninguna"]},
}


@pytest.mark.parametrize("language", ["en", "es"])
def test_the_kind_editor_in_each_language(page: Any, live_server: LiveServer,
                                          engine: sa.Engine, language: str,
                                          make_user: Callable[..., dict[str, Any]]) -> None:
    """The editor's own words, the preview of the saved kind, and a refused save's
    message and field error, in the admin's language (the kind's name and the API field
    names stay as the API spells them)."""
    _as_admin(page, live_server, engine, language, make_user)
    words = EDITOR[language]
    page.goto(f"{live_server.url}/transactional/")
    row = page.locator("#kind-verification")
    for text in words["list"]:
        expect(page.locator("#kinds-table")).to_contain_text(text)
    expect(row.locator("[data-stat=dedupe]")).to_have_text(words["list"][2])
    row.get_by_role("link", name="verification").click()
    expect(page.locator("h1")).to_have_text(words["title"])
    expect(page.locator("select[name=class] option:checked")).to_have_text(words["class"])
    _sees(page, words["labels"], f"kind-{language}")
    preview = page.frame_locator("#kind-preview")
    expect(preview.locator("#preview-subject")).to_have_text("Confirm your email address")

    page.fill("input[name=retry_schedule]", "abc")
    page.locator("#kind-form button.primary").click()
    expect(page.locator("#kind-error")).to_be_visible()
    for text in words["schedule"]:
        expect(page.locator("#kind-error")).to_contain_text(text)
    expect(page.locator("input[name=retry_schedule] ~ .field-error")).to_contain_text(
        words["schedule_field"])
    expect(page.locator("input[name=retry_schedule]")).to_have_value("abc")  # kept
    _shot(page, f"kind-refused-{language}")

    page.fill("input[name=retry_schedule]", "30, 120")
    page.fill("input[name=subject]", "Confirm {{ data.name")
    page.locator("#kind-form button.primary").click()
    expect(page.locator("#kind-error")).to_contain_text(words["template"])
    expect(page.locator("#kind-error .excerpt")).to_contain_text("Confirm {{ data.name")
    _shot(page, f"kind-template-error-{language}")
