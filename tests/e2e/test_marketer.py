"""A marketer in a real browser: import a CSV (with bad lines), compose a campaign, see a
template error with its line, preview it, send it, and watch the counters reach their final
values without reloading; then the demo's seeded draft, from the dashboard to 'sent'."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import ARTIFACTS, LiveServer, login

pytestmark = pytest.mark.e2e

CSV = ("\ufeffemail;name;plan\n"
       + "".join(f"reader{i}@example.org;Reader {i};{'pro' if i % 2 else 'free'}\n"
                 for i in range(40))
       + "bounce-1@example.net;Gone;free\n"
       + "not-an-address;Bad;free\n"
       + "READER3@example.org;Dup;free\n")


def _counter(page: Any, state: str) -> Any:
    return page.locator(f"#campaign-counters [data-state={state}] .n")


def test_marketer_imports_composes_previews_sends_and_watches(
        page: Any, live_server: LiveServer, sink: Any, tmp_path: Path,
        make_user: Callable[..., dict[str, Any]]) -> None:
    sink.set_rules({"rules": [
        {"match": "bounce-*@example.net", "reply": "550 5.1.1 The email account does not exist"},
        {"match": "reader7@example.org", "reply": "451 4.3.0 Try again later", "times": 1}],
        "delay": 0.05})
    page.on("dialog", lambda dialog: dialog.accept())
    login(page, live_server, make_user("marketer"))

    # An empty product says what to do first.
    page.goto(f"{live_server.url}/campaigns/")
    page.get_by_role("link", name="Create a list").click()
    page.fill("input[name=name]", "Newsletter")
    page.get_by_role("button", name="Create list").click()
    expect(page.locator("text=This list is empty")).to_be_visible()

    # Import: the report names each rejected line; the rest is imported.
    page.get_by_role("link", name="Import CSV").first.click()
    csv_file = tmp_path / "readers.csv"
    csv_file.write_text(CSV, encoding="utf-8")
    page.set_input_files("input[type=file]", str(csv_file))
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#import-added")).to_have_text("41")
    rejected = page.locator("#import-rejected-lines tbody tr")
    expect(rejected).to_have_count(2)
    expect(rejected.nth(0)).to_contain_text("43")
    expect(rejected.nth(0)).to_contain_text("invalid address")
    expect(rejected.nth(1)).to_contain_text("duplicate")
    expect(rejected.nth(1)).to_contain_text("same address as line 5")
    page.screenshot(path=str(ARTIFACTS / "list-import-report.png"), full_page=True)
    page.get_by_role("link", name="Back to the list").click()
    expect(page.locator("#list-subscribers tbody tr")).to_have_count(41)
    page.fill("input[name=q]", "reader1")  # live search (HTMX), no reload
    expect(page.locator("#list-subscribers tbody tr")).to_have_count(11)
    page.screenshot(path=str(ARTIFACTS / "list-detail.png"), full_page=True)

    # Compose with a template error: shown with its line, nothing typed is lost.
    page.get_by_role("link", name="New campaign to this list").click()
    page.fill("input[name=name]", "Spring news")
    page.fill("input[name=subject]", "Spring news for {{ name }}")
    page.fill("textarea[name=html]", "<h1>Hello {{ name }}</h1>\n<p>Plan: {{ attributes.plan }</p>")
    page.fill("textarea[name=text]", "Hello {{ name }}\nUnsubscribe: {{ unsubscribe_url }}")
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator("#compose-error")).to_contain_text("line 2")
    expect(page.locator("textarea[name=text]")).to_have_value(
        "Hello {{ name }}\nUnsubscribe: {{ unsubscribe_url }}")
    page.screenshot(path=str(ARTIFACTS / "campaign-template-error.png"), full_page=True)
    page.fill("textarea[name=html]",
              "<h1>Hello {{ name }}</h1>\n<p>Plan: {{ attributes.plan }}</p>")
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator(".flash-success")).to_contain_text("Draft saved")

    # Preview for a chosen real subscriber.
    page.get_by_role("link", name="Preview it").click()
    page.fill("input[name=q]", "reader5@")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#preview-subject")).to_have_text("Spring news for Reader 5")
    frame = page.frame_locator("iframe.preview-frame")
    expect(frame.locator("p")).to_have_text("Plan: pro")
    page.screenshot(path=str(ARTIFACTS / "campaign-preview.png"), full_page=True)

    # Review who will receive it, and send.
    page.get_by_role("link", name="Review and send…").click()
    expect(page.locator("#audience-will-receive")).to_contain_text("41")
    page.screenshot(path=str(ARTIFACTS / "campaign-review.png"), full_page=True)
    page.get_by_role("button", name=re.compile(r"Send now to 41 recipients")).click()

    # The live page: counters reach their final values without reloading.
    expect(page.locator("#campaign-status")).to_have_text("sent", timeout=60_000)
    expect(_counter(page, "sent")).to_have_text("40")
    expect(_counter(page, "bounced")).to_have_text("1")
    expect(page.locator("#campaign-done")).to_have_text("41")
    expect(page.locator("table.errors")).to_contain_text("5.1.1")
    expect(page.locator("#campaign-live")).not_to_have_attribute("hx-trigger", re.compile("."))
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "campaign.png"), full_page=True)


def test_demo_draft_goes_from_dashboard_to_sent(page: Any, live_server: LiveServer,
                                                engine: sa.Engine, sink: Any) -> None:
    from webapp import demo

    sink.set_rules(demo.SINK_RULES)
    with engine.begin() as conn:
        demo.seed(conn, 800, "demo-password-123")
    page.on("dialog", lambda dialog: dialog.accept())
    login(page, live_server, {"email": "marketer@example.com",
                              "password": "demo-password-123"})
    page.goto(live_server.url + "/")
    page.get_by_role("link", name="November newsletter").click()
    page.get_by_role("link", name="Review and send…").click()
    # The warm-up campaign may already have bounced (and so suppressed) a few addresses.
    will_receive = int(page.locator("#audience-will-receive strong").inner_text()
                       .replace(",", ""))
    assert 795 <= will_receive <= 800
    page.locator("#send-button").click()
    expect(page.locator("#campaign-status")).to_have_text("sending")
    page.screenshot(path=str(ARTIFACTS / "campaign-sending.png"), full_page=True)
    expect(page.locator("#campaign-status")).to_have_text("sent", timeout=90_000)
    # Every 40th address is scripted: 5 bounce (or are skipped: the warm-up campaign may
    # have suppressed them first), 5 are refused as spam (failed, never suppressed), the
    # mailbox-full and try-later ones retry and are sent in the end.
    expect(_counter(page, "sent")).to_have_text("790")
    expect(_counter(page, "failed")).to_have_text("5")
    assert int(_counter(page, "bounced").inner_text()) <= 5
    page.screenshot(path=str(ARTIFACTS / "campaign-demo-sent.png"), full_page=True)
