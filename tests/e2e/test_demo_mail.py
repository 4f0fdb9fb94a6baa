"""The demo's mail viewer in Chromium: in a running `senddock demo`, a
visitor subscribes through a double opt-in form, the admin opens the confirmation mail in
Demo mail, clicks its link, and the subscription is confirmed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import free_port, settings, wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from webapp.domain import lists, subscriptions

pytestmark = pytest.mark.e2e


def _members(engine: sa.Engine, list_id: int) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.email: r.status for r in conn.execute(sa.text(
            "SELECT s.email, s.status FROM memberships m JOIN subscribers s "
            "ON s.id = m.subscriber_id WHERE m.list_id = :l"), {"l": list_id})}


def test_the_confirmation_link_clicked_in_the_viewer_confirms(
        browser: Any, engine: sa.Engine, db_url: str, tmp_path: Path,
        spawn: Callable[..., Any], make_user: Callable[..., dict[str, Any]]) -> None:
    port, smtp_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    values = settings(db_url, smtp_port, BASE_URL=url, DATA_DIR=str(tmp_path / "demo"))
    proc = spawn(["demo", "--port", str(port), "--smtp-port", str(smtp_port),
                  "--subscribers", "20"], values)
    try:
        wait_for(lambda: "SendDock listening on" in proc.output()
                 or proc.popen.poll() is not None, timeout=120, message="the demo to start")
        assert proc.popen.poll() is None, proc.output()
        assert f"{url}/demo/mail" in proc.output()
        server = LiveServer(proc, url, values)
        with engine.begin() as conn:
            list_id = lists.create_list(conn, "Garden club")["id"]
            subscriptions.save_form(conn, list_id, enabled=True, title="Garden club news",
                                    intro="", accent="#2b6cb0", actor="test")
        address = "vera@example.org"

        visitor = browser.new_context()
        page = visitor.new_page()
        page.goto(f"{url}/subscribe/{list_id}")
        page.fill("input[name=email]", address)
        page.get_by_role("button", name="Subscribe", exact=True).click()
        expect(page.locator("#subscribe-done")).to_be_visible()
        visitor.close()
        assert _members(engine, list_id) == {}

        admin = browser.new_context()
        errors: list[str] = []
        page = admin.new_page()
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        login(page, server, make_user("admin"))
        page.get_by_role("link", name="Demo mail").click()
        expect(page.locator("h1")).to_have_text("Demo mail")

        def listed() -> bool:
            page.goto(f"{url}/demo/mail/?q={address}")
            return page.locator("#demo-mail tbody tr").count() == 1

        wait_for(listed, timeout=60, message="the confirmation in Demo mail")
        page.get_by_role("link", name="Confirm your subscription to Garden club").click()
        expect(page.locator("#mail-headers")).to_contain_text(address)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo-mail-confirmation.png"), full_page=True)
        link = page.locator("#mail-text a")
        expect(link).to_have_attribute("href", re.compile(
            rf"^{re.escape(url)}/subscribe/confirm/\S+$"))
        with page.expect_popup() as popup_info:
            link.click()
        confirm = popup_info.value
        confirm.get_by_role("button", name="Yes, subscribe me").click()
        expect(confirm.locator("h1")).to_have_text("You are subscribed")
        expect(confirm.locator("#confirmed")).to_contain_text(address)
        assert _members(engine, list_id) == {address: "active"}
        confirm.close()

        # An HTML message (the campaign the demo is sending): its links, inside the
        # sandboxed frame, open the demo's real pages in a new tab.
        reader = "reader1@example.com"
        page.goto(f"{url}/demo/mail/?q={reader}")
        wait_for(lambda: page.goto(f"{url}/demo/mail/?q={reader}") and page.locator(
            "#demo-mail tbody tr").count() == 1, timeout=60, message="the campaign message")
        page.locator("#demo-mail tbody a").first.click()
        frame = page.frame_locator("#mail-html")
        expect(frame.locator("h1")).to_have_text("Hello Reader 1!")
        with page.expect_popup() as popup_info:
            frame.get_by_role("link", name="Unsubscribe").click()
        unsubscribe = popup_info.value
        expect(unsubscribe.locator("h1")).to_have_text("Unsubscribe?")
        assert unsubscribe.url.startswith(f"{url}/")
        page.screenshot(path=str(ARTIFACTS / "demo-mail-html.png"), full_page=True)
        admin.close()
        assert not [e for e in errors if "Content Security Policy" in e], errors
    finally:
        if proc.popen.poll() is None:
            proc.terminate(timeout=60)  # the demo stops its own sink
