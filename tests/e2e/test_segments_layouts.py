"""Segments and layouts in a real browser, in English and Spanish:
a marketer saves a layout (a bad one is refused, saying why, and the preview shows the good
one), builds a segment with its live count (a bad date is answered while typing), composes
a campaign to the segment in the layout with its text made from the HTML, previews it and
sends it; the SMTP sink gets exactly the segment's recipients, each in the layout with the
postal address and their own unsubscribe link, and the campaign counts them exactly."""

from __future__ import annotations

import email
import email.policy
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from webapp.domain import lists

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"save_layout": "Save layout", "save_segment": "Save segment",
           "unsubscribe_missing": "put {{ unsubscribe_url }} in it",
           "bad_date": "condition 3: a date like 2026-01-31",
           "would_get": "recipients would get it",
           "text_from_html": "Text from HTML", "save_draft": "Save draft",
           "sent_to": "Sent to the segment"},
    "es": {"save_layout": "Guardar plantilla de diseño", "save_segment": "Guardar segmento",
           "unsubscribe_missing": "incluye {{ unsubscribe_url }}",
           "bad_date": "condición 3: una fecha como 2026-01-31",
           "would_get": "destinatarios lo recibirían", "text_from_html": "Texto a partir del HTML",
           "save_draft": "Guardar borrador", "sent_to": "Se envía al segmento"},
}
PEOPLE = [("ana", "pro", "ES"), ("beto", "pro", "MX"), ("carla", "free", "ES"),
          ("dan", "pro", "US"), ("eva", "pro", "MX"), ("gus", "free", "MX")]
CHOSEN = {"ana", "beto", "eva"}
LAYOUT = ("<html><body><header>GARDEN CLUB</header>{{ content }}<footer>{{ postal_address }}"
          " · <a href=\"{{ unsubscribe_url }}\">Unsubscribe</a></footer></body></html>")


def _seed(engine: sa.Engine, lang: str) -> int:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, f"Customers {lang}")["id"])
        lists.add_subscribers(conn, list_id, [
            {"email": f"{n}-{lang}@example.org", "name": n.title(),
             "attributes": {"plan": plan, "country": country}}
            for n, plan, country in PEOPLE])
    return list_id


def _sent_to(sink: Any, lang: str) -> dict[str, email.message.EmailMessage]:
    found = {}
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        to = str(message["To"])
        if to.endswith(f"-{lang}@example.org"):
            found[to.split("-")[0]] = message
    return found


def _layout(page: Any, server: LiveServer, words: dict[str, str], lang: str) -> None:
    page.goto(f"{server.url}/layouts/")
    editor = page.locator("#layout-editor")
    editor.locator("input[name=name]").fill(f"Garden {lang}")
    editor.locator("textarea[name=postal_address]").fill("Calle Mayor 1, 28013 Madrid")
    editor.locator("textarea[name=html]").fill("<p>{{ content }}</p>")  # no unsubscribe link
    editor.get_by_role("button", name=words["save_layout"]).click()
    expect(page.locator("#layout-html-error")).to_contain_text(words["unsubscribe_missing"])
    editor = page.locator("#layout-editor")
    expect(editor.locator("input[name=name]")).to_have_value(f"Garden {lang}")  # kept
    editor.locator("textarea[name=html]").fill(LAYOUT)
    editor.get_by_role("button", name=words["save_layout"]).click()
    frame = page.frame_locator("#layout-preview")
    expect(frame.locator("header")).to_have_text("GARDEN CLUB")
    expect(frame.locator("footer")).to_contain_text("Calle Mayor 1, 28013 Madrid")


def _segment(page: Any, server: LiveServer, words: dict[str, str], list_id: int) -> None:
    page.goto(f"{server.url}/lists/{list_id}/segments/")
    builder = page.locator("#segment-builder")
    builder.locator("input[name=name]").fill("Pro ES/MX")
    choices, keys, values = (builder.locator(f"[name={n}]") for n in ("choice", "key", "value"))
    choices.nth(0).select_option("attribute:eq")
    keys.nth(0).fill("plan")
    values.nth(0).fill("pro")
    count = page.locator("#segment-will-receive")
    expect(count).to_have_attribute("data-count", "4")  # ana, beto, dan, eva
    choices.nth(1).select_option("attribute:in")
    keys.nth(1).fill("country")
    values.nth(1).fill("ES, MX")
    expect(count).to_have_attribute("data-count", "3")
    expect(count).to_contain_text(words["would_get"])
    choices.nth(2).select_option("subscribed:after")
    values.nth(2).fill("last week")
    expect(page.locator("#segment-count-error")).to_contain_text(words["bad_date"])
    choices.nth(2).select_option("")
    expect(count).to_have_attribute("data-count", "3")
    builder.get_by_role("button", name=words["save_segment"]).click()
    expect(page.locator("#saved-segments")).to_contain_text("Pro ES/MX")


@pytest.mark.parametrize("lang", ["en", "es"])
def test_a_marketer_sends_to_a_segment_in_a_layout(
        browser: Any, live_server: LiveServer, engine: sa.Engine, sink: Any, lang: str,
        make_user: Callable[..., dict[str, Any]]) -> None:
    words = WORDS[lang]
    list_id = _seed(engine, lang)
    context = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang},
                                  viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())
    login(page, live_server, make_user("marketer"))
    _layout(page, live_server, words, lang)
    _segment(page, live_server, words, list_id)
    with engine.connect() as conn:
        segment_id, layout_id = conn.execute(sa.text(
            "SELECT (SELECT id FROM segments WHERE list_id = :l), "
            "(SELECT id FROM layouts WHERE name = :n)"), {"l": list_id, "n": f"Garden {lang}"}
        ).one()

    page.goto(f"{live_server.url}/campaigns/new?list={list_id}")
    page.fill("input[name=name]", f"Spring {lang}")
    page.fill("input[name=subject]", "Spring news, {{ name }}")
    page.fill("textarea[name=html]", "<h1>Hello {{ name }}</h1><p>Tulips are in.</p>")
    page.select_option("select[name=segment_id]", str(segment_id))
    expect(page.locator("#segment-will-receive")).to_have_attribute("data-count", "3")
    page.select_option("select[name=layout_id]", str(layout_id))
    page.get_by_role("button", name=words["text_from_html"]).click()
    text = page.locator("textarea[name=text]")
    expect(text).to_have_value(
        "GARDEN CLUB\n\nHello {{ name }}\n\nTulips are in.\n\nCalle Mayor 1, 28013 Madrid · "
        "Unsubscribe ({{ unsubscribe_url }})\n")
    text.fill(text.input_value().replace("Tulips are in.", "Tulips are in (text)."))
    page.get_by_role("button", name=words["save_draft"]).click()
    page.wait_for_url(f"{live_server.url}/campaigns/*")
    campaign_id = int(page.url.rstrip("/").split("/")[-1])

    page.goto(f"{live_server.url}/campaigns/{campaign_id}/preview")
    frame = page.frame_locator("iframe").first
    expect(frame.locator("header")).to_have_text("GARDEN CLUB")
    page.goto(f"{live_server.url}/campaigns/{campaign_id}/send")
    expect(page.locator("#review-segment")).to_contain_text(words["sent_to"])
    expect(page.locator("#audience-will-receive")).to_contain_text("3")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"segment-review-{lang}.png"), full_page=True)
    page.locator("#send-button").click()
    wait_for(lambda: len(_sent_to(sink, lang)) >= 3, timeout=60, message="3 messages")
    with engine.connect() as conn:
        wait_for(lambda: conn.execute(sa.text("SELECT status FROM campaigns WHERE id = :c"),
                                      {"c": campaign_id}).scalar_one() == "sent"
                 and not conn.commit(), timeout=60, message="campaign sent")
        total = conn.execute(sa.text("SELECT total FROM broadcasts b JOIN campaigns c "
                                     "ON c.broadcast_id = b.id WHERE c.id = :c"),
                             {"c": campaign_id}).scalar_one()
    got = _sent_to(sink, lang)
    assert set(got) == CHOSEN and total == 3
    for name, message in got.items():
        html = message.get_body(("html",)).get_content()  # type: ignore[union-attr]
        plain = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
        unsubscribe = str(message["List-Unsubscribe"]).strip("<>")
        assert "<header>GARDEN CLUB</header><h1>Hello " + name.title() in html
        assert "Calle Mayor 1, 28013 Madrid" in html and unsubscribe in html
        assert "Tulips are in (text)." in plain and unsubscribe in plain
    page.goto(f"{live_server.url}/campaigns/{campaign_id}")
    page.screenshot(path=str(ARTIFACTS / f"segment-sent-{lang}.png"), full_page=True)
    context.close()
    assert not errors, errors
