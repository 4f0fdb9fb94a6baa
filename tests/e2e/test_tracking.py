"""Analytics and the web version in a real browser, in English and Spanish: a
marketer composes a campaign with opens and clicks tracked and a web
version, sends it; the delivered message (from the test SMTP sink) is opened in a browser
as a recipient would, its image loads and its link is clicked; the campaign page then
shows the open and the click, and the web version shows no recipient's data."""

from __future__ import annotations

import email
import email.policy
import re
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
    "en": {"save": "Save draft", "review": "Review and send…", "send": "Send now to",
           "sent": "sent", "tracked": "Opens and clicks are tracked for this campaign.",
           "unique": "unique", "total": "total"},
    "es": {"save": "Guardar borrador", "review": "Revisar y enviar…",
           "send": "Enviar ahora a", "sent": "enviada",
           "tracked": "Se registran las aperturas y los clics de esta campaña.",
           "unique": "únicas", "total": "en total"},
}


def _html_of(sink: Any, address: str) -> str | None:
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        if address in str(message["To"]) and isinstance(message, email.message.EmailMessage):
            part = message.get_body(preferencelist=("html",))
            return None if part is None else str(part.get_content())
    return None


@pytest.mark.parametrize("lang", ["en", "es"])
def test_marketer_tracks_a_campaign_and_reads_its_opens_and_clicks(
        browser: Any, live_server: LiveServer, engine: sa.Engine, sink: Any, lang: str,
        make_user: Callable[..., dict[str, Any]]) -> None:
    words = WORDS[lang]
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Readers")["id"]
        lists.add_subscribers(conn, list_id, [
            {"email": "rita@example.org", "name": "Rita"},
            {"email": "sam@example.org", "name": "Sam"}])
    target = f"{live_server.url}/login?from=newsletter"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang,
                                  extra_http_headers={"Accept-Language": lang})
    errors: list[str] = []
    page = context.new_page()
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("dialog", lambda dialog: dialog.accept())  # "Send … now?"
    login(page, live_server, make_user("marketer"))
    page.goto(f"{live_server.url}/campaigns/new?list={list_id}")
    page.fill("input[name=name]", "Spring sale")
    page.fill("input[name=subject]", "Spring sale, {{ name }}")
    page.fill("textarea[name=html]",
              f'<p>Hi {{{{ name }}}}</p><p><a href="{target}">See the sale</a></p>'
              '<p><a href="{{ archive_url }}">View in browser</a></p>')
    fields = page.locator("#tracking-fields")
    expect(fields.locator("input[name=track_opens]")).not_to_be_checked()  # off by default
    expect(fields.locator("input[name=track_clicks]")).not_to_be_checked()
    fields.locator("input[name=track_opens]").check()
    fields.locator("input[name=track_clicks]").check()
    fields.locator("input[name=archive]").check()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"compose-tracking-{lang}.png"), full_page=True)
    page.get_by_role("button", name=words["save"], exact=True).click()
    expect(page.locator("#tracking-state")).to_contain_text(words["tracked"])
    campaign_url = page.url
    page.get_by_role("link", name=words["review"]).click()
    page.get_by_role("button", name=re.compile(words["send"])).click()
    expect(page.locator("#campaign-status")).to_have_text(words["sent"], timeout=90_000)

    # The recipient opens the delivered message: its image loads, the link is clicked.
    html = wait_for(lambda: _html_of(sink, "rita@example.org"), timeout=60,
                    message="the message in the sink")
    assert re.search(rf'<img src="{re.escape(live_server.url)}/o/[^"]+\.gif"', html), html
    assert target not in html  # the link goes through the tracking URL
    reader = browser.new_context(locale=lang)
    inbox = reader.new_page()
    with inbox.expect_response(re.compile(r"/o/[^/]+\.gif$")) as pixel:
        inbox.set_content(html)
    assert pixel.value.status == 200
    inbox.get_by_role("link", name="See the sale").click()
    inbox.wait_for_url(target)
    # The web version: the same campaign, for a neutral stand-in.
    inbox.set_content(html)
    inbox.get_by_role("link", name="View in browser").click()
    inbox.wait_for_url(re.compile(r"/archive/"))
    assert "Hi Subscriber</p>" in inbox.content() and "Rita" not in inbox.content()
    reader.close()

    page.goto(campaign_url)
    expect(page.locator("#stat-opens")).to_contain_text(f"1 {words['unique']}")
    expect(page.locator("#stat-clicks")).to_contain_text(f"1 {words['unique']}")
    expect(page.locator("#stat-clicks")).to_contain_text(f"1 {words['total']}")
    expect(page.locator("#link-clicks")).to_contain_text(target)
    expect(page.locator("#web-version-link")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / f"campaign-engagement-{lang}.png"), full_page=True)
    context.close()
    assert not [e for e in errors if "Content Security Policy" in e], errors
