"""A welcome sequence in a real browser, in English and in Spanish (docs/sequences.md): a
marketer builds it in the builder (email, wait, condition, second email), a subscriber is
added to the list, the first message reaches the sink, the wait ends by the database
clock, the second message follows, and support reads the person's timeline."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import LiveServer
from webapp.domain import lists

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"login": "Log in", "sequences": "Sequences", "steps": "Steps",
           "email": "Email", "wait": "Wait", "condition": "Condition", "add": "Add step",
           "create": "Create sequence", "look_up": "Look up", "waited": "waited",
           "held": "condition held"},
    "es": {"login": "Iniciar sesión", "sequences": "Secuencias", "steps": "Pasos",
           "email": "Correo", "wait": "Espera", "condition": "Condición",
           "add": "Añadir paso", "create": "Crear secuencia", "look_up": "Buscar",
           "waited": "esperó", "held": "condición cumplida"},
}


def _subjects(sink: Any, address: str) -> list[str]:
    return [r["subject"] for r in sink.records() if address in r["rcpt_tos"]]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_marketer_builds_a_welcome_sequence_and_support_reads_the_timeline(
        browser: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]], lang: str) -> None:
    words = WORDS[lang]
    marketer = make_user("marketer")
    support = make_user("support")
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Newcomers")["id"])
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang,
                                  extra_http_headers={"Accept-Language": lang})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    def log_in(user: dict[str, Any]) -> None:
        page.context.clear_cookies()
        page.goto(f"{live_server.url}/login")
        page.fill("input[name=email]", user["email"])
        page.fill("input[name=password]", user["password"])
        page.get_by_role("button", name=words["login"]).click()
        page.wait_for_url(re.compile(r"^(?!.*/login).*$"))

    # The marketer builds the sequence: a list trigger, then four steps.
    log_in(marketer)
    page.goto(f"{live_server.url}/sequences/")
    expect(page.locator("h1")).to_have_text(words["sequences"])
    page.fill("#new-sequence input[name=name]", "Welcome series")
    page.select_option("#trigger-type", "list_add")
    page.select_option("#new-sequence select[name=list_id]", str(list_id))
    page.get_by_role("button", name=words["create"]).click()
    expect(page.locator("#sequence-steps h2")).to_have_text(words["steps"])

    def add(kind: str, fill: Callable[[Any], None]) -> None:
        section = page.locator("#add-step details").filter(
            has=page.locator(f"#add-{kind}-step"))
        section.locator("summary").click()
        form = page.locator(f"#add-{kind}-step")
        fill(form)
        form.get_by_role("button", name=words["add"]).click()
        page.wait_for_load_state()

    add("email", lambda f: (f.locator("input[name=subject]").fill("Welcome {{ name }}"),
                            f.locator("textarea[name=text_body]").fill("Hello {{ email }}")))
    add("wait", lambda f: (f.locator("input[name=wait_seconds]").fill("1"),
                           f.locator("select[name=wait_unit]").select_option("3600")))
    add("condition", lambda f: (f.locator("select[name=condition_test]").select_option(
        "attribute"), f.locator("input[name=attribute]").fill("plan"),
        f.locator("input[name=value]").fill("pro"),
        f.locator("select[name=if_false]").select_option("exit")))
    add("email", lambda f: (f.locator("input[name=subject]").fill("Getting started"),
                            f.locator("textarea[name=text_body]").fill("Step two")))
    summaries = page.locator("#sequence-steps details.step summary")
    expect(summaries).to_have_count(4)
    expect(summaries.nth(0)).to_contain_text(f"{words['email']}: Welcome")
    expect(summaries.nth(1)).to_contain_text(f"{words['wait']} 3")  # 3,600 s / 3.600 s
    expect(summaries.nth(2)).to_contain_text(f"{words['condition']}: plan = pro")
    expect(summaries.nth(3)).to_contain_text(f"{words['email']}: Getting started")
    with engine.connect() as conn:
        seq_id, steps = conn.execute(sa.text(
            "SELECT s.id, array_agg(t.type ORDER BY t.position) FROM sequences s "
            "JOIN sequence_steps t ON t.sequence_id = s.id GROUP BY s.id")).one()
    assert steps == ["email", "wait", "condition", "email"]

    # A subscriber joins the list (any add enrols); the first message reaches the sink.
    address = f"new-{lang}@example.org"
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [
            {"email": address, "name": "Nadia", "attributes": {"plan": "pro"}}])
    wait_for(lambda: _subjects(sink, address), timeout=60, message="step 1 at the sink")
    assert _subjects(sink, address) == ["Welcome Nadia"]

    # The wait holds by the database clock: the enrollment waits at the condition.
    with engine.connect() as conn:
        due_in = conn.execute(sa.text(
            "SELECT extract(epoch FROM due_at - now()) FROM sequence_enrollments")).scalar_one()
    assert 3000 < due_in <= 3600
    log_in(support)
    page.goto(f"{live_server.url}/sequences/people")
    page.fill("input[name=email]", address)
    page.get_by_role("button", name=words["look_up"]).click()
    rows = page.locator("#person article.enrollment tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text(words["waited"])
    assert _subjects(sink, address) == ["Welcome Nadia"]

    # The hour passes: the due time moves back, the advancer still checks it against now().
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE sequence_enrollments SET due_at = now() - interval '1 second'"))
    wait_for(lambda: len(_subjects(sink, address)) == 2, timeout=60,
             message="step 4 at the sink")
    assert _subjects(sink, address) == ["Welcome Nadia", "Getting started"]
    page.reload()
    expect(page.locator("#person article.enrollment [data-status]")).to_have_attribute(
        "data-status", "done", timeout=30_000)
    expect(rows).to_have_count(4)
    expect(rows.nth(2)).to_contain_text(words["held"])
    expect(rows.nth(3)).to_contain_text("#")  # the job of the second message

    # The marketer's funnel counts the two messages.
    log_in(marketer)
    page.goto(f"{live_server.url}/sequences/{seq_id}")
    sent = page.locator("#sequence-funnel tbody tr td.sent")
    expect(sent).to_have_text(["1", "0", "0", "1"])
    expect(page.locator("#sequence-outcomes [data-why=done]")).to_contain_text(": 1")
    context.close()
    assert not [e for e in errors if "Content Security Policy" in e], errors
