"""The sequences pages: the builder, the funnel, a person's enrollments; each
role as the role table says; errors keep what was typed; both languages."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser
from webapp.domain import lists
from workers.delivery import sequences as engine_sequences


def test_marketer_builds_and_support_reads_a_person(
        client: Any, app: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Newsletter")["id"]
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get("/sequences/")
    assert page.status_code == 200 and "New sequence" in page.get_data(as_text=True)
    assert 'href="/sequences/"' in page.get_data(as_text=True)  # in the navigation
    bad = marketer.post("/sequences/", {"name": "Welcome", "trigger_type": "list_add"})
    text = bad.get_data(as_text=True)
    assert bad.status_code == 422 and "list_id is required" in text and 'value="Welcome"' in text
    made = marketer.post("/sequences/", {"name": "Welcome", "trigger_type": "list_add",
                                         "list_id": str(list_id), "goal_event": "purchased"})
    assert made.status_code == 200
    sequence_id = int(made.request.path.rsplit("/", 1)[1])
    wrong = marketer.post(f"/sequences/{sequence_id}/steps", {
        "type": "email", "subject": "Hi {{ name", "text_body": "kept text"})
    assert wrong.status_code == 422
    assert "kept text" in wrong.get_data(as_text=True)
    for step in ({"type": "email", "subject": "Welcome {{ email }}", "text_body": "Hello"},
                 {"type": "wait", "wait_seconds": "2", "wait_unit": "86400"},
                 {"type": "email", "subject": "Day two", "text_body": "Again"}):
        assert marketer.post(f"/sequences/{sequence_id}/steps", step).status_code == 200
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "ann@example.org"}])
        engine_sequences.advance(conn)
        wait = conn.execute(sa.text("SELECT wait_seconds FROM sequence_steps "
                                    "WHERE type = 'wait'")).scalar_one()
    assert wait == 2 * 86400
    funnel = marketer.get(f"/sequences/{sequence_id}?fragment=funnel").get_data(as_text=True)
    assert 'hx-trigger="every 5s"' in funnel
    assert '<td class="entered num">1</td>' in funnel
    es = marketer.get(f"/sequences/{sequence_id}", headers={"Accept-Language": "es"})
    assert "Embudo" in es.get_data(as_text=True)
    paused = marketer.post(f"/sequences/{sequence_id}/pause")
    assert "Due steps wait" in paused.get_data(as_text=True) or \
        "due steps wait" in paused.get_data(as_text=True)
    support = Browser(app.test_client(), make_user("support"))
    assert support.get("/sequences/").status_code == 403
    person = support.get("/sequences/people?email=ann@example.org")
    text = person.get_data(as_text=True)
    assert person.status_code == 200
    assert "Welcome" in text and "sent" in text and "waited" in text
    assert support.get("/sequences/people?email=nobody@example.org").status_code == 404
    spanish = support.get("/sequences/people?email=ann@example.org",
                          headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "enviado" in spanish


def test_the_navigation_marks_one_item_in_the_sequences_area(
        client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    """Sequences and Enrollments are two items of one area: each page marks its own."""
    browser = Browser(client, make_user("admin"))
    for path, item in (("/sequences/", "Sequences"), ("/sequences/people", "Enrollments")):
        page = browser.get(path).get_data(as_text=True)
        current = re.findall(r'aria-current="page">([^<]+)</a>', page)
        assert current == [item], (path, current)
