"""Wide tables in a narrow window, in Chromium, in English and Spanish: at 390 px the
page itself never scrolls sideways; a table wider than its box scrolls inside it, shows a
shadow on the side with more to see, and is a labelled region that takes keyboard focus
(the arrow keys then scroll it); at 1280 px the same tables are not marked."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer, login
from webapp import demo
from webapp.domain import users
from webapp.i18n import LANGUAGES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PASSWORD = "wide-tables-walk-1"
PAGES = ("/jobs/", "/admin/users", "/admin/suppressions", "/admin/audit", "/campaigns/")
LABEL = {"en": "Table wider than the window: scroll sideways to see the rest",
         "es": "Tabla más ancha que la ventana: desplázate de lado para ver el resto"}

_WIDE = """() => Array.from(document.querySelectorAll('main .table-scroll.is-wide')).map(b => ({
    role: b.getAttribute('role'), tabindex: b.getAttribute('tabindex'),
    label: b.getAttribute('aria-label'), scroll: b.scrollWidth, box: b.clientWidth,
    shadow: getComputedStyle(b).backgroundImage}))"""


@pytest.mark.parametrize("language", ["en", "es"])
def test_wide_tables_scroll_in_their_box_with_a_hint(browser: Any, live_server: LiveServer,
                                                     engine: sa.Engine, language: str) -> None:
    with engine.begin() as conn:
        demo.seed(conn, 50, PASSWORD)
        email = next(e for e, r in demo.DEMO_USERS.items() if r == "admin")
        found = users.find_user(conn, email)
        assert found is not None
        users.set_locale(conn, int(found["id"]), language, allowed=LANGUAGES, actor="test")
    narrow = browser.new_context(viewport={"width": 390, "height": 844})
    page = narrow.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    marked = 0
    for path in PAGES:
        answer = page.goto(live_server.url + path)
        assert answer is not None and answer.ok, path
        page.wait_for_load_state("load")
        width, window = page.evaluate(
            "[document.scrollingElement.scrollWidth, window.innerWidth]")
        assert width <= window, f"{path}: the page is {width} px wide in {window} px"
        boxes = page.evaluate(_WIDE)
        for box in boxes:
            assert box["scroll"] > box["box"], (path, box)
            assert box["role"] == "region" and box["tabindex"] == "0", (path, box)
            assert box["label"].endswith(LABEL[language]), (path, box)
            assert "radial-gradient" in box["shadow"], (path, box)
        if boxes:
            marked += 1
            region = page.locator("main .table-scroll.is-wide").first
            region.focus()
            assert page.evaluate("document.activeElement.classList.contains('is-wide')")
            before = region.evaluate("b => b.scrollLeft")
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                f"b => b.scrollLeft > {before}", arg=region.element_handle())
    assert marked >= 2, "the narrow window found fewer than two wide tables"
    narrow.close()
    wide = browser.new_context(viewport={"width": 1280, "height": 900})
    page = wide.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/admin/users")
    page.wait_for_load_state("load")
    assert page.evaluate(_WIDE) == []
    assert page.locator("main .table-scroll").count() >= 1
    wide.close()
