"""Opens and clicks of a sequence's messages (docs/sequences.md), against real PostgreSQL,
the real worker pool and the test SMTP sink: a tracking sequence's messages carry signed
tracking links and an open pixel; following them through the web app records the event
and redirects to the stored URL; the "opened / clicked the previous email" conditions read
those events; an untracked sequence's messages are left as written; a condition on
tracking the sequence does not do is refused."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from webapp.domain import lists, personal_data
from webapp.domain import sequences as domain
from webapp.domain.errors import Invalid
from workers.core.settings import Config
from workers.delivery import sequences
from workers.delivery.pool import Pool

BASE = "http://127.0.0.1:5000"  # tests/conftest.py settings()
HTML = ('<html><body><p>Hi {{ name }}</p><p><a href="https://shop.example/start">Start</a> '
        '<a href="{{ unsubscribe_url }}">Unsubscribe</a></p></body></html>')
TEXT = "Hi {{ name }}\nStart: https://shop.example/start\n"


def _sequence(engine: sa.Engine, list_id: int, name: str, test: str,
              **tracking: bool) -> dict[str, Any]:
    steps = [{"type": "email", "subject": f"{name} one", "text_body": TEXT, "html_body": HTML},
             {"type": "wait", "wait_seconds": 3600},
             {"type": "condition", "condition": {"test": test}, "if_false": "exit"},
             {"type": "email", "subject": f"{name} two", "text_body": "Again"}]
    with engine.begin() as conn:
        return domain.create_sequence(conn, {
            "name": name, "trigger_type": "list_add", "list_id": list_id, "steps": steps,
            **tracking}, "tests")


def _messages(sink: Any) -> dict[tuple[str, str], email.message.EmailMessage]:
    out = {}
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, email.message.EmailMessage)
        out[(str(message["To"]), str(message["Subject"]))] = message
    return out


def _html(message: email.message.EmailMessage) -> str:
    body = message.get_body(preferencelist=("html",))
    assert body is not None
    return str(body.get_content())


def _text(message: email.message.EmailMessage) -> str:
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    return str(body.get_content())


def _deliver(engine: sa.Engine, config: Config, sink: Any, count: int) -> None:
    pool = Pool(engine, config, node="test-node")
    pool.start()
    try:
        wait_for(lambda: len(sink.raw_messages()) >= count, timeout=60,
                 message=f"{count} messages at the sink")
    finally:
        pool.stop()


def _second_steps(engine: sa.Engine) -> set[tuple[str, str]]:
    """(address, subject) of every job of a second email step."""
    with engine.connect() as conn:
        return {(r.email, r.subject) for r in conn.execute(sa.text(
            "SELECT j.email, st.subject FROM sequence_visits v "
            "JOIN delivery_jobs j ON j.id = v.job_id "
            "JOIN sequence_steps st ON st.id = v.step_id WHERE st.subject LIKE '%two'"))}


def test_opened_and_clicked_conditions_follow_real_tracked_links(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config], client: Any) -> None:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Trial")["id"])
    _sequence(engine, list_id, "Clicks", "clicked", track_opens=True, track_clicks=True)
    _sequence(engine, list_id, "Opens", "opened", track_opens=True, track_clicks=True)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "ann@example.org", "name": "Ann"},
                                              {"email": "bob@example.org", "name": "Bob"}])
    assert sequences.tick(engine) == 4
    _deliver(engine, config_for(sink.port), sink, 4)
    messages = _messages(sink)
    links: dict[tuple[str, str], str] = {}
    pixels: dict[tuple[str, str], str] = {}
    for key, message in messages.items():
        html, text = _html(message), _text(message)
        (links[key],) = re.findall(r'href="(http://127\.0\.0\.1:5000/r/[^"]+)"', html)
        (pixels[key],) = re.findall(r'<img src="(http://127\.0\.0\.1:5000/o/[^"]+)"', html)
        assert "shop.example" not in html and "shop.example" not in text
        assert re.search(r"Start: http://127\.0\.0\.1:5000/r/\S+", text), text
        assert 'href="http://127.0.0.1:5000/u/' in html  # the unsubscribe link as it is

    # Ann clicks in both first messages (no image loaded); Bob only opens them.
    for subject in ("Clicks one", "Opens one"):
        r = client.get(links[("ann@example.org", subject)].removeprefix(BASE))
        assert r.status_code == 302 and r.headers["Location"] == "https://shop.example/start"
        r = client.get(pixels[("bob@example.org", subject)].removeprefix(BASE))
        assert r.status_code == 200 and r.mimetype == "image/gif"
    # A tampered token is refused, records nothing.
    forged = links[("bob@example.org", "Clicks one")].removeprefix(BASE)[:-2] + "aa"
    assert client.get(forged).status_code == 404
    with engine.connect() as conn:
        recorded = sorted(conn.execute(sa.text(
            "SELECT s.email, st.subject, x.kind FROM sequence_events x "
            "JOIN subscribers s ON s.id = x.subscriber_id "
            "JOIN sequence_steps st ON st.id = x.step_id")).all())
    assert [tuple(r) for r in recorded] == [
        ("ann@example.org", "Clicks one", "click"), ("ann@example.org", "Opens one", "click"),
        ("bob@example.org", "Clicks one", "open"), ("bob@example.org", "Opens one", "open")]

    # A person's export lists their sequence opens and clicks.
    with engine.begin() as conn:
        exported = personal_data.export(conn, "ann@example.org", actor="tests")
    assert [(e["kind"], e["url"]) for e in exported["sequence_tracking_events"]] == [
        ("click", "https://shop.example/start")] * 2

    # The funnel counts messages opened (a click counts) and clicked, per email step.
    with engine.connect() as conn:
        clicks_id = conn.execute(sa.text(
            "SELECT id FROM sequences WHERE name = 'Clicks'")).scalar_one()
        first = domain.funnel(conn, clicks_id)["steps"][0]
    assert (first["opened"], first["clicked"]) == (2, 1)

    # The hour passes (the due time moves back; the advancer still compares with now()).
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE sequence_enrollments SET due_at = now() - interval '1 second'"))
    while sequences.tick(engine):
        pass
    # Clicked: Ann continues, Bob (an open is not a click) exits. Opened: a click proves
    # the message was opened, so both continue.
    assert _second_steps(engine) == {("ann@example.org", "Clicks two"),
                                     ("ann@example.org", "Opens two"),
                                     ("bob@example.org", "Opens two")}
    with engine.connect() as conn:
        ends = conn.execute(sa.text(
            "SELECT s.email, q.name, e.status, e.exit_reason FROM sequence_enrollments e "
            "JOIN subscribers s ON s.id = e.subscriber_id "
            "JOIN sequences q ON q.id = e.sequence_id ORDER BY 1, 2")).all()
    assert [tuple(r) for r in ends] == [
        ("ann@example.org", "Clicks", "done", None), ("ann@example.org", "Opens", "done", None),
        ("bob@example.org", "Clicks", "exited", "condition"),
        ("bob@example.org", "Opens", "done", None)]


def test_untracked_sequence_mail_is_left_as_written_and_conditions_need_tracking(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Plain")["id"])
        seq = domain.create_sequence(conn, {
            "name": "Plain", "trigger_type": "list_add", "list_id": list_id, "steps": [
                {"type": "email", "subject": "Plain one", "text_body": TEXT,
                 "html_body": HTML}]}, "tests")
        assert seq["track_opens"] is False and seq["track_clicks"] is False
        with pytest.raises(Invalid) as refused:
            domain.add_step(conn, seq["id"], {"type": "condition",
                                              "condition": {"test": "clicked"}}, "tests")
        assert "click tracking" in refused.value.message
        lists.add_subscribers(conn, list_id, [{"email": "cy@example.org", "name": "Cy"}])
    assert sequences.tick(engine) == 1
    _deliver(engine, config_for(sink.port), sink, 1)
    ((_, message),) = _messages(sink).items()
    html = _html(message)
    assert 'href="https://shop.example/start"' in html
    assert "/r/" not in html and "/o/" not in html and "<img" not in html
    with engine.begin() as conn:
        domain.update_sequence(conn, seq["id"], {"track_opens": True}, "tests")
        step = domain.add_step(conn, seq["id"], {"type": "condition",
                                                 "condition": {"test": "opened"}}, "tests")
    assert step["condition"] == {"test": "opened"}
