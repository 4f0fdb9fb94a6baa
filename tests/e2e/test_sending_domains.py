"""An admin in a real browser generates a DKIM key and copies its DNS record with the
copy button (static/js/copy.js: no inline script, the page fixture fails on any CSP
violation); the clipboard holds exactly the stored record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer, login
from workers.building import dkim

pytestmark = pytest.mark.e2e


def test_generate_a_key_and_copy_its_record(page: Any, live_server: LiveServer,
                                            engine: sa.Engine,
                                            make_user: Callable[..., dict[str, Any]]) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                   origin=live_server.url)
    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/admin/domains")
    page.fill("input[name=domain]", "mail.example.net")
    page.click("text=Generate key")
    expect(page.locator(".flash-success")).to_contain_text("signed with it from now on")
    with engine.connect() as conn:
        (key,) = dkim.list_keys(conn, "mail.example.net")
    expect(page.locator("#record-sd1")).to_have_text(key.record_value)
    page.click("[data-copy=record-sd1]")
    expect(page.locator("[data-copy=record-sd1]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key.record_value
    page.click("[data-copy=zone-sd1]")
    assert page.evaluate("navigator.clipboard.readText()") == key.zone_line
    expect(page.locator("#domain-checks")).to_contain_text(
        "no DKIM record is published at sd1._domainkey.mail.example.net")
