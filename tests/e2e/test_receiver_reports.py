"""An admin in a real browser uploads DMARC and SMTP TLS reports (and a file that is no
report), sees what was stored and why the other file was refused, and opens the domain's
deliverability page from the list; then in Spanish."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer, login

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parents[1] / "unit" / "receiver_reports"


def test_upload_reports_and_see_the_domain_page(page: Any, live_server: LiveServer,
                                                tmp_path: Path,
                                                make_user: Callable[..., dict[str, Any]]
                                                ) -> None:
    begin = int(time.time()) - 2 * 86400
    xml = (HERE / "aggregate.xml").read_text()
    xml = xml.replace("<begin>1764460800</begin>", f"<begin>{begin}</begin>")
    xml = xml.replace("<end>1764547199</end>", f"<end>{begin + 86399}</end>")
    (tmp_path / "google.xml").write_text(xml)
    (tmp_path / "junk.txt").write_text("hello")
    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/admin/domains")
    page.click("text=Receiver reports (DMARC, SMTP TLS): upload and list")
    page.set_input_files("input[name=files]", [str(tmp_path / "google.xml"),
                                                str(HERE / "tls.json"),
                                                str(tmp_path / "junk.txt")])
    page.click("#upload-reports button[type=submit]")
    expect(page.locator(".flash-success")).to_contain_text("2 report(s) stored")
    expect(page.locator(".flash-error")).to_contain_text(
        "junk.txt was not read: not a recognized report format")
    expect(page.locator("#rejects")).to_contain_text("junk.txt")
    page.locator("#reports").get_by_role("link", name="senddock.test").first.click()
    expect(page.locator("h1")).to_contain_text("senddock.test")
    expect(page.locator("#rates")).to_contain_text("47")
    expect(page.locator("#not-ours")).to_contain_text("203.0.113.9")
    expect(page.locator("#tls")).to_contain_text("certificate-expired")
    page.context.set_extra_http_headers({"Accept-Language": "es"})
    page.reload()
    expect(page.locator("#not-ours h2")).to_contain_text("Fuentes que no son sus relays")
