"""What the screenshot pass (bench/screenshots.py) found, kept fixed, in Chromium, in
English and Spanish: a receiver's reply in the dashboard's failures keeps a readable column
at 390 px (it was squeezed to one letter, the words spilling out of the cell), and the DKIM
form's algorithm shows its chosen choice whole (a 16rem select cut "RSA-2048 (la aceptan
todos)")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer, demo_user, login
from tests.helpers import place_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PASSWORD = "screenshot-pass-1"

_REPLY_CELLS = """() => Array.from(document.querySelectorAll('#dash-failures td'))
  .filter(td => td.querySelector(':scope > code.reply'))
  .map(td => ({width: td.clientWidth, content: td.scrollWidth}))"""
# The chosen option's text as the select draws it, against the room the select gives it
# (its width less padding and Chromium's drop-down arrow, about 20 px).
_SELECT_ROOM = """s => {
  const style = getComputedStyle(s);
  const pen = document.createElement('canvas').getContext('2d');
  pen.font = style.font;
  return [pen.measureText(s.options[s.selectedIndex].text).width,
          s.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 20];
}"""


def _admin(engine: sa.Engine, language: str) -> str:
    email = demo_user(engine, "admin", language, PASSWORD, subscribers=30)
    # The seeded campaign's 30 jobs are enqueued and sent by the server's pool; once all
    # are done, three become failures of the last hour.
    for _ in range(300):
        with engine.connect() as conn:
            done = conn.execute(sa.text(
                "SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FROM delivery_jobs"
            )).one()
        if done[1] == 30 and done[0] == 30:
            break
        time.sleep(0.1)
    assert done == (30, 30), done
    with engine.begin() as conn:
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'failed', attempts = 1, finished_at = now(),
                   last_error = '550 5.7.1 Message rejected as spam by policy',
                   last_error_class = 'rejected'
             WHERE id IN (SELECT id FROM delivery_jobs ORDER BY id DESC LIMIT 3)"""))
    return email


@pytest.mark.parametrize("language", ["en", "es"])
def test_failures_reply_column_is_readable_at_390(browser: Any, live_server: LiveServer,
                                                  engine: sa.Engine, language: str) -> None:
    email = _admin(engine, language)
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale=language)
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/")
    cells = page.evaluate(_REPLY_CELLS)
    assert len(cells) == 3, cells
    for cell in cells:
        assert cell["width"] >= 150, cell  # 12rem less padding, not one letter
        assert cell["content"] <= cell["width"] + 2, cell  # no word spills out
    width, window = page.evaluate("[document.scrollingElement.scrollWidth, innerWidth]")
    assert width <= window
    context.close()


@pytest.mark.parametrize("language", ["en", "es"])
@pytest.mark.parametrize("width", [1280, 390])
def test_dkim_algorithm_choice_is_shown_whole(browser: Any, live_server: LiveServer,
                                              engine: sa.Engine, language: str,
                                              width: int) -> None:
    email = _admin(engine, language)
    context = browser.new_context(viewport={"width": width, "height": 900}, locale=language)
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/admin/domains")
    select = page.locator("main select[name=algorithm]")
    for value in ("rsa", "ed25519"):
        select.select_option(value)
        text, room = select.evaluate(_SELECT_ROOM)
        if width >= 1000 or value == "rsa":  # a phone may cut the long second choice
            assert text <= room, (value, text, room)
    scroll, window = page.evaluate("[document.scrollingElement.scrollWidth, innerWidth]")
    assert scroll <= window
    context.close()


@pytest.mark.parametrize("language", ["en", "es"])
def test_token_form_fields_sit_under_their_heading(browser: Any, live_server: LiveServer,
                                                   engine: sa.Engine, language: str) -> None:
    """The scopes fieldset was a narrow column beside the fields, and the row's bottom
    alignment pushed "Acts as", "Name" and "Expires" some 200 px under their heading; a
    user who never signed in was "never" on the Spanish page."""
    email = demo_user(engine, "admin", language, PASSWORD, subscribers=5)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=language)
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/admin/users")
    form = page.locator("main form:has(fieldset.scopes)")
    top = form.bounding_box()
    acts_as = form.locator("select[name=user_id]")
    field = acts_as.bounding_box()
    scopes = form.locator("fieldset.scopes").bounding_box()
    assert top and field and scopes
    assert field["y"] - top["y"] < 60, (top, field)  # the fields lead the form
    assert scopes["y"] >= field["y"] + field["height"], (field, scopes)  # scopes below
    assert scopes["width"] > 0.9 * top["width"], (top, scopes)  # a row of its own
    text, room = acts_as.evaluate(_SELECT_ROOM)
    assert text <= room, (text, room)  # "admin@example.com (administrador)" whole
    # The marketer and support never signed in: their last login says so in the page's
    # language (it said "never" on Spanish pages).
    cells = page.locator("main table.grid").first.locator("td.nowrap").all_inner_texts()
    assert cells.count({"en": "never", "es": "nunca"}[language]) == 2, cells
    context.close()


@pytest.mark.parametrize("language", ["en", "es"])
def test_sequence_tables_are_laid_out_as_the_others(browser: Any, live_server: LiveServer,
                                                    engine: sa.Engine, language: str) -> None:
    """The sequences' tables (the list, a sequence's funnel) had no class: bold centred
    headings, numbers on the left, columns jammed together at the table's content width."""
    from webapp.domain import sequences

    email = demo_user(engine, "marketer", language, PASSWORD, subscribers=5)
    with engine.begin() as conn:
        list_id = conn.execute(sa.text("SELECT min(id) FROM lists")).scalar_one()
        seq = sequences.create_sequence(conn, {
            "name": "Welcome series", "trigger_type": "list_add", "list_id": list_id,
            "steps": [{"type": "wait", "wait_seconds": 3600},
                      {"type": "email", "subject": "Welcome", "text_body": "Hi"}]},
            actor="test")
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=language)
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    for path, table in ((f"/sequences/{seq['id']}", "#sequence-funnel table"),
                        ("/sequences/", "#sequence-list")):
        page.goto(live_server.url + path)
        shape = page.locator(table).evaluate("""t => ({
            table: t.getBoundingClientRect().width,
            box: t.parentElement.getBoundingClientRect().width,
            numbers: Array.from(t.querySelectorAll('tbody td:last-child'))
                .map(td => getComputedStyle(td).textAlign),
            heading: getComputedStyle(t.querySelector('th')).textTransform})""")
        assert shape["table"] >= shape["box"] - 1, (path, shape)  # the card's width
        assert shape["numbers"] and set(shape["numbers"]) == {"right"}, (path, shape)
        assert shape["heading"] == "uppercase", (path, shape)
        # A sequence is feminine in Spanish: "activa", as a DKIM key is (it said "activo").
        badge = page.locator("main .badge-active").first.inner_text()
        assert badge == {"en": "active", "es": "activa"}[language], (path, badge)
    context.close()


def test_built_in_kinds_are_described_in_spanish(browser: Any, live_server: LiveServer,
                                                 engine: sa.Engine) -> None:
    """The transactional page showed the built-in kinds' stored English descriptions."""
    email = demo_user(engine, "admin", "es", PASSWORD, subscribers=5)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="es")
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/transactional/")
    text = page.locator("main").inner_text()
    assert "Verificación de registro (incorporado)" in text
    assert "Doble confirmación: confirmar una suscripción" in text
    assert "Signup verification" not in text and "Double opt-in" not in text
    context.close()


def test_subscriber_status_choices_are_in_spanish(browser: Any, live_server: LiveServer,
                                                  engine: sa.Engine) -> None:
    """A subscriber's page offered its status as stored: "active", "unsubscribed"."""
    email = demo_user(engine, "marketer", "es", PASSWORD, subscribers=5)
    with engine.connect() as conn:
        list_id, subscriber_id = conn.execute(sa.text(
            "SELECT list_id, subscriber_id FROM memberships ORDER BY 1, 2 LIMIT 1")).one()
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="es")
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(f"{live_server.url}/lists/{list_id}/subscribers/{subscriber_id}")
    choices = page.locator("main select[name=status] option").all_inner_texts()
    values = page.locator("main select[name=status] option").evaluate_all(
        "os => os.map(o => o.value)")
    assert len(choices) == 3 and "active" in values, (choices, values)
    assert [c.strip() for c in choices][values.index("active")] == "activo", choices
    assert not set(values) & {c.strip() for c in choices}, (choices, values)
    context.close()


def test_support_user_page_names_the_kind_in_spanish(browser: Any, live_server: LiveServer,
                                                     engine: sa.Engine) -> None:
    """A user's page headed its verification mail with the stored kind, "verification",
    beside "Reenviar el correo de verificación"."""
    from tests.helpers import enqueue_verification

    email = demo_user(engine, "support", "es", PASSWORD, subscribers=5)
    with engine.begin() as conn:
        enqueue_verification(conn, "new-user@example.org", "user-4242")
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="es")
    page = context.new_page()
    login(page, live_server, {"email": email, "password": PASSWORD})
    page.goto(live_server.url + "/support/users/user-4242")
    heading = page.locator("#kind-verification h2").inner_text()
    assert heading.startswith("verificación"), heading
    context.close()


_CHART = """() => {
  const svg = document.querySelector('#sent-chart svg.chart');
  const label = svg.querySelector('text.chart-label');
  return [svg.getBoundingClientRect().height, label.getBoundingClientRect().height];
}"""


@pytest.mark.parametrize("width", [1280, 390])
def test_the_hours_chart_is_readable_at_every_width(
        browser: Any, live_server: LiveServer, width: int,
        make_user: Callable[..., dict[str, Any]]) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900}, locale="es")
    page = context.new_page()
    login(page, live_server, make_user("admin"))
    page.goto(live_server.url + "/health/")
    chart_height, label_height = page.evaluate(_CHART)
    assert chart_height >= 100, chart_height  # it was 30 px at 390
    assert label_height >= 9, label_height  # and its labels 3 px
    scroll, window = page.evaluate("[document.scrollingElement.scrollWidth, innerWidth]")
    assert scroll <= window  # the chart scrolls inside its box, not the page
    context.close()


def test_the_hours_chart_opens_on_the_latest_minutes_on_a_phone(
        browser: Any, live_server: LiveServer,
        make_user: Callable[..., dict[str, Any]]) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 900}, locale="en")
    page = context.new_page()
    login(page, live_server, make_user("admin"))
    page.goto(live_server.url + "/health/")
    box = page.locator("#sent-chart")
    scrolled, room, visible = box.evaluate(
        "b => [Math.abs(b.scrollLeft), b.scrollWidth - b.clientWidth, b.clientWidth]")
    assert room > 0 and visible > 0
    # The newest minute is drawn at the right: the box opens scrolled to that end.
    right = box.evaluate("""b => {
        const r = b.getBoundingClientRect();
        const labels = b.querySelectorAll('text.chart-label');
        const last = labels[1].getBoundingClientRect();
        return [last.right <= r.right + 1, last.left >= r.left - 1];
    }""")
    assert right == [True, True], (scrolled, room, right)
    context.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_date_filters_take_a_dates_room(browser: Any, live_server: LiveServer, width: int,
                                        make_user: Callable[..., dict[str, Any]]) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900}, locale="es")
    page = context.new_page()
    login(page, live_server, make_user("support"))
    page.goto(live_server.url + "/inbox/")
    for name in ("from", "to"):
        box = page.locator(f"main input[name={name}][type=date]").bounding_box()
        assert box is not None and 120 <= box["width"] <= 200, (name, box)  # was 1,100 px
    context.close()
