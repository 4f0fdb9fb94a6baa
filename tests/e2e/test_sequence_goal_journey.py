"""A welcome series started by a confirmed subscription, in a real browser, in English and
in Spanish (docs/sequences.md): a visitor subscribes through the list's double opt-in form
and confirms from the email; the sequence's first message reaches the sink; the marketer's
funnel counts it; the team's app posts the goal event (``POST /api/v1/events``) before the
third step is due, and the person leaves the series: step 3 is never sent, even once its
time has come."""

from __future__ import annotations

import email
import email.policy
import json
import re
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import LiveServer, login
from webapp.domain import lists, sequences, subscriptions, users
from workers.delivery import sequences as advancer

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"subscribe": "Subscribe", "done": "check your inbox", "yes": "Yes, subscribe me",
           "subscribed": "You are subscribed", "goal": "reached the goal",
           "look_up": "Look up"},
    "es": {"subscribe": "Suscribirme", "done": "revisa tu correo", "yes": "Sí, suscribirme",
           "subscribed": "Ya estás suscrito", "goal": "alcanzó el objetivo",
           "look_up": "Buscar"},
}
STEPS = [{"type": "email", "subject": "Welcome {{ name }}", "text_body": "Hello {{ email }}"},
         {"type": "wait", "wait_seconds": 3600},
         {"type": "email", "subject": "Your first week", "text_body": "Tips"}]


def _to(sink: Any, address: str) -> list[email.message.EmailMessage]:
    found = []
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        if address in str(message["To"]):
            found.append(message)
    return found


def _subjects(sink: Any, address: str) -> list[str]:
    return [str(m["Subject"]) for m in _to(sink, address)]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_confirmed_subscriber_gets_step_one_and_leaves_on_the_goal(
        browser: Any, live_server: LiveServer, engine: sa.Engine, sink: Any, lang: str,
        make_user: Callable[..., dict[str, Any]]) -> None:
    words = WORDS[lang]
    support = make_user("support")
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Garden club")["id"])
        subscriptions.save_form(conn, list_id, enabled=True, title="Garden club news",
                                intro="Seeds and tips.", accent="#2563eb",
                                actor="test")
        sequence = sequences.create_sequence(conn, {
            "name": "Welcome", "trigger_type": "list_confirm", "list_id": list_id,
            "goal_event": "purchased", "steps": STEPS}, "test")
        token = users.create_token(conn, support["id"], "app")

    # A visitor subscribes and confirms from the email.
    visitor = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang})
    page = visitor.new_page()
    page.goto(f"{live_server.url}/subscribe/{list_id}")
    address = f"vera-{lang}@example.org"
    page.fill("input[name=email]", address)
    page.fill("input[name=name]", "Vera")
    page.get_by_role("button", name=words["subscribe"], exact=True).click()
    expect(page.locator("#subscribe-done")).to_contain_text(words["done"])
    confirmation = wait_for(lambda: _to(sink, address), timeout=60,
                            message="the confirmation email in the sink")[0]
    body = confirmation.get_body(preferencelist=("plain",))
    assert body is not None
    link = re.search(r"http://\S+/subscribe/confirm/\S+", body.get_content())
    assert link, body.get_content()
    with engine.connect() as conn:  # not enrolled before the confirmation
        assert conn.execute(sa.text("SELECT count(*) FROM sequence_enrollments")).scalar() == 0
    page.goto(link[0])
    page.get_by_role("button", name=words["yes"]).click()
    expect(page.locator("h1")).to_have_text(words["subscribed"])
    visitor.close()

    # Step 1 reaches the sink; the funnel counts it.
    wait_for(lambda: "Welcome Vera" in _subjects(sink, address), timeout=60,
             message="step 1 at the sink")
    marketer = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang})
    page = marketer.new_page()
    login(page, live_server, make_user("marketer"))
    page.goto(f"{live_server.url}/sequences/{sequence['id']}")
    expect(page.locator("#sequence-funnel tbody tr td.sent")).to_have_text(["1", "0", "0"])

    # The app reports the goal; the person leaves before step 3.
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/events", method="POST",
        data=json.dumps({"email": address, "name": "purchased"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
    with engine.begin() as conn:  # step 3's time comes anyway
        conn.execute(sa.text(
            "UPDATE sequence_enrollments SET due_at = now() - interval '1 second'"))
    for _ in range(3):  # the advancer's ticks (the server's run too): nothing to advance
        assert advancer.tick(engine) == 0
    page.reload()
    expect(page.locator("#sequence-outcomes [data-why=goal]")).to_contain_text(words["goal"])
    page.context.clear_cookies()
    login(page, live_server, support)
    page.goto(f"{live_server.url}/sequences/people")
    page.fill("input[name=email]", address)
    page.get_by_role("button", name=words["look_up"]).click()
    expect(page.locator("#person article.enrollment h3")).to_contain_text(words["goal"])
    marketer.close()
    assert _subjects(sink, address) == [str(confirmation["Subject"]), "Welcome Vera"]
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT status, exit_reason FROM sequence_enrollments")).one() == ("exited", "goal")
        assert conn.execute(sa.text(  # one visit made a job: step 1's
            "SELECT count(*) FROM sequence_visits WHERE job_id IS NOT NULL")).scalar() == 1
