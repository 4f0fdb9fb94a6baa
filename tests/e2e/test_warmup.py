"""An admin in a real browser starts a warm-up on a sending domain's deliverability page,
sees its day and caps there and on Queue health, and stops it; then in Spanish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer, login

pytestmark = pytest.mark.e2e


def test_start_see_and_stop_a_warm_up(page: Any, live_server: LiveServer,
                                      make_user: Callable[..., dict[str, Any]]) -> None:
    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/admin/domains/warm.example/deliverability")
    expect(page.locator("#warmup")).to_contain_text("Not in warm-up")
    page.fill("#warmup input[name=caps]", "30, 60, 120")
    page.fill("#warmup input[name=hour_share]", "50")
    page.click("#warmup button[type=submit]")
    expect(page.locator(".flash-success")).to_contain_text(
        "Warm-up of warm.example started: day 1 today.")
    expect(page.locator("#warmup-day")).to_have_text("1")
    expect(page.locator("#warmup-cap")).to_have_text("30")
    expect(page.locator("#warmup-sent")).to_have_text("0")
    page.goto(f"{live_server.url}/health/")
    expect(page.locator("#warmups")).to_contain_text("warm.example")
    expect(page.locator("#warmups")).to_contain_text("30")
    page.context.set_extra_http_headers({"Accept-Language": "es"})
    page.locator("#warmups").get_by_role("link", name="warm.example").click()
    expect(page.locator("#warmup h2")).to_have_text("Calentamiento")
    page.click("#warmup button[type=submit]")
    expect(page.locator(".flash-success")).to_contain_text(
        "Calentamiento de warm.example detenido")
    expect(page.locator("#warmup")).to_contain_text("Sin calentamiento")
