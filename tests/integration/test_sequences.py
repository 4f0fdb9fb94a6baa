"""Sequences against a real PostgreSQL: enrolment by list add, confirmation and
event; the advancer's steps, exits and the database clock; at most one job per
(enrollment, step) with two advancers at once; the due query's plan."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from webapp.domain import lists
from webapp.domain import sequences as domain
from workers import queue
from workers.delivery import sequences


def _list(engine: sa.Engine, name: str = "Welcome") -> int:
    with engine.begin() as conn:
        return int(lists.create_list(conn, name)["id"])


def _add(engine: sa.Engine, list_id: int, emails: list[str],
         attributes: dict[str, Any] | None = None) -> None:
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [
            {"email": e, "attributes": attributes or {}} for e in emails])


EMAIL1 = {"type": "email", "subject": "Welcome {{ name }}", "text_body": "Hi {{ email }}"}
EMAIL2 = {"type": "email", "subject": "Step two", "text_body": "More"}


def _sequence(engine: sa.Engine, list_id: int | None = None, steps: list[Any] | None = None,
              **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "Welcome series", "steps": steps or [EMAIL1, EMAIL2]}
    if list_id is not None:
        data.update(trigger_type="list_add", list_id=list_id)
    data.update(extra)
    with engine.begin() as conn:
        return domain.create_sequence(conn, data, "tests")


def _jobs(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT id, email, idempotency_key, payload, status, priority FROM delivery_jobs "
            "WHERE kind = 'sequence' ORDER BY id")).all()


def _enrollments(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT * FROM sequence_enrollments ORDER BY id")).all()


def _advance_all(engine: sa.Engine) -> int:
    total = 0
    while (n := sequences.tick(engine)) > 0:
        total += n
    return total


def test_list_add_enrols_in_the_same_transaction_and_steps_become_jobs(
        engine: sa.Engine) -> None:
    list_id = _list(engine)
    seq = _sequence(engine, list_id)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "a@example.org"}])
        # Visible inside the add's own transaction.
        assert conn.execute(sa.text("SELECT count(*) FROM sequence_enrollments")).scalar() == 1
    with engine.begin() as conn:
        conn.execute(sa.text("SAVEPOINT x"))
        lists.add_subscribers(conn, list_id, [{"email": "rolled@example.org"}])
        conn.execute(sa.text("ROLLBACK TO SAVEPOINT x"))
    assert len(_enrollments(engine)) == 1
    assert _advance_all(engine) == 1
    jobs = _jobs(engine)
    assert [j.email for j in jobs] == ["a@example.org", "a@example.org"]
    e = _enrollments(engine)[0]
    assert e.status == "done"
    steps = [s["id"] for s in seq["steps"]]
    assert [j.idempotency_key for j in jobs] == [f"seq:{e.id}:{s}" for s in steps]
    assert [j.payload["step_id"] for j in jobs] == steps
    assert all(j.priority == 5 for j in jobs)  # lifecycle
    # Adding again (already on the list) and re-adding after leaving: once ever.
    _add(engine, list_id, ["a@example.org"])
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memberships"))
    _add(engine, list_id, ["a@example.org"])
    assert len(_enrollments(engine)) == 1


def test_reentry_after_n_days(engine: sa.Engine) -> None:
    list_id = _list(engine)
    _sequence(engine, list_id, reentry_days=1)
    _add(engine, list_id, ["r@example.org"])
    _advance_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memberships"))
    _add(engine, list_id, ["r@example.org"])
    assert len(_enrollments(engine)) == 1  # within the day
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memberships"))
        conn.execute(sa.text(
            "UPDATE sequence_enrollments SET entered_at = now() - interval '2 days'"))
    _add(engine, list_id, ["r@example.org"])
    assert len(_enrollments(engine)) == 2


def test_confirmation_trigger_waits_for_double_opt_in(engine: sa.Engine) -> None:
    list_id = _list(engine)
    _sequence(engine, list_id, trigger_type="list_confirm")
    _add(engine, list_id, ["imported@example.org"])
    assert _enrollments(engine) == []
    with engine.begin() as conn:
        rid = conn.execute(sa.text(
            "INSERT INTO subscription_requests (list_id, email, source, remote_addr) "
            "VALUES (:l, 'imported@example.org', 'form', '127.0.0.1') RETURNING id"),
            {"l": list_id}).scalar_one()
        conn.execute(sa.text("UPDATE subscription_requests SET confirmed_at = now() "
                             "WHERE id = :id"), {"id": rid})
    assert len(_enrollments(engine)) == 1


def test_double_opt_in_confirmation_through_the_confirm_link_enrols(engine: sa.Engine) -> None:
    from webapp.domain import subscriptions

    list_id = _list(engine)
    _sequence(engine, list_id, trigger_type="list_confirm")
    added = _sequence(engine, list_id, name="Any add")
    with engine.begin() as conn:
        rid = conn.execute(sa.text(
            "INSERT INTO subscription_requests (list_id, email, source, remote_addr) "
            "VALUES (:l, 'form@example.org', 'form', '127.0.0.1') RETURNING id"),
            {"l": list_id}).scalar_one()
        subscriptions.confirm(conn, "secret", subscriptions.confirm_token("secret", rid),
                              remote_addr="127.0.0.1")
        # Confirming twice (the link clicked again) enrols nobody twice.
        subscriptions.confirm(conn, "secret", subscriptions.confirm_token("secret", rid),
                              remote_addr="127.0.0.1")
    enrolled = _enrollments(engine)
    assert len(enrolled) == 2
    assert {e.sequence_id for e in enrolled} == {added["id"], added["id"] - 1}


def test_wait_step_is_never_done_before_its_time_by_the_database_clock(
        engine: sa.Engine) -> None:
    list_id = _list(engine)
    _sequence(engine, list_id, steps=[EMAIL1, {"type": "wait", "wait_seconds": 2}, EMAIL2])
    _add(engine, list_id, ["w@example.org"])
    assert sequences.tick(engine) == 1
    assert len(_jobs(engine)) == 1
    with engine.connect() as conn:
        due, now = conn.execute(sa.text(
            "SELECT due_at, now() FROM sequence_enrollments")).one()
    assert 1.5 < (due - now).total_seconds() <= 2.0
    assert sequences.tick(engine) == 0  # not due yet
    assert len(_jobs(engine)) == 1
    wait_for(lambda: sequences.tick(engine) == 1, timeout=10, message="the wait to end")
    with engine.connect() as conn:
        sent_at = conn.execute(sa.text(
            "SELECT max(created_at) FROM delivery_jobs WHERE kind = 'sequence'")).scalar_one()
    assert len(_jobs(engine)) == 2
    assert sent_at >= due


def test_window_moves_to_next_start() -> None:
    from datetime import UTC, datetime
    at = datetime(2026, 1, 1, 22, 30, tzinfo=UTC)
    assert sequences.next_window(at, 9, 17) == datetime(2026, 1, 2, 9, tzinfo=UTC)
    assert sequences.next_window(at.replace(hour=6), 9, 17) == datetime(2026, 1, 1, 9,
                                                                        tzinfo=UTC)
    assert sequences.next_window(at.replace(hour=10), 9, 17) == at.replace(hour=10)
    assert sequences.next_window(at, 22, 6) == at  # wraps midnight
    assert sequences.next_window(at.replace(hour=12), 22, 6) == datetime(2026, 1, 1, 22,
                                                                         tzinfo=UTC)


def test_conditions_continue_skip_or_exit(engine: sa.Engine) -> None:
    list_id = _list(engine)
    seq = _sequence(engine, list_id, steps=[
        {"type": "condition", "condition": {"test": "attribute", "attribute": "plan",
                                            "value": "pro"}, "if_false": "skip"},
        {"type": "email", "subject": "Pro tips", "text_body": "pro"},
        {"type": "condition", "condition": {"test": "event", "event": "activated"},
         "if_false": "exit"},
        {"type": "email", "subject": "Activated", "text_body": "yay"}])
    _add(engine, list_id, ["pro@example.org"], {"plan": "pro"})
    _add(engine, list_id, ["free@example.org"], {"plan": "free"})
    with engine.begin() as conn:
        domain.record_event(conn, {"email": "free@example.org", "name": "activated"})
    _advance_all(engine)
    got = {(j.email, j.payload["step_id"]) for j in _jobs(engine)}
    ids = [s["id"] for s in seq["steps"]]
    assert got == {("pro@example.org", ids[1]), ("free@example.org", ids[3])}
    by = {e.subscriber_id: e for e in _enrollments(engine)}
    assert sorted((e.status, e.exit_reason) for e in by.values()) == [
        ("done", None), ("exited", "condition")]


def test_exits_on_goal_unsubscribe_suppression(engine: sa.Engine) -> None:
    list_id = _list(engine)
    _sequence(engine, list_id, goal_event="purchased",
              steps=[{"type": "wait", "wait_seconds": 0}, EMAIL1])
    emails = ["goal@example.org", "unsub@example.org", "bounce@example.org",
              "ok@example.org"]
    _add(engine, list_id, emails)
    with engine.begin() as conn:
        out = domain.record_event(conn, {"email": "goal@example.org", "name": "purchased",
                                         "data": {"total": 5}})
        assert len(out["exited"]) == 1
        conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                             "WHERE email = 'unsub@example.org'"))
        conn.execute(sa.text("INSERT INTO suppressions (email, reason) "
                             "VALUES ('bounce@example.org', 'bounced')"))
    _advance_all(engine)
    assert [j.email for j in _jobs(engine)] == ["ok@example.org"]
    with engine.connect() as conn:
        reasons = dict(conn.execute(sa.text(
            "SELECT s.email, coalesce(e.exit_reason, e.status) FROM sequence_enrollments e "
            "JOIN subscribers s ON s.id = e.subscriber_id")).all())
    assert reasons == {"goal@example.org": "goal", "unsub@example.org": "unsubscribed",
                       "bounce@example.org": "hard_bounce", "ok@example.org": "done"}


def test_event_enrols_with_its_data_and_reentry_once(engine: sa.Engine) -> None:
    _sequence(engine, None, trigger_type="event", trigger_event="signed_up")
    with engine.begin() as conn:
        first = domain.record_event(conn, {"email": "e@example.org", "name": "signed_up",
                                           "user_id": "u-1", "data": {"plan": "pro"}})
        again = domain.record_event(conn, {"user_id": "u-1", "name": "signed_up"})
    assert len(first["enrolled"]) == 1 and again["enrolled"] == []
    assert _enrollments(engine)[0].data == {"plan": "pro"}
    _advance_all(engine)
    assert all(j.payload["data"] == {"plan": "pro"} for j in _jobs(engine))


def test_pause_resume_and_remove_step(engine: sa.Engine) -> None:
    list_id = _list(engine)
    seq = _sequence(engine, list_id, steps=[{"type": "wait", "wait_seconds": 0}, EMAIL1,
                                            EMAIL2])
    with engine.begin() as conn:
        domain.set_status(conn, seq["id"], "pause", "tests")
    _add(engine, list_id, ["p@example.org"])
    assert _advance_all(engine) == 0  # paused: due steps wait
    assert _enrollments(engine)[0].status == "paused"
    ids = [s["id"] for s in seq["steps"]]
    with engine.begin() as conn:
        assert domain.remove_step(conn, seq["id"], ids[0], "tests") == 1
        domain.remove_step(conn, seq["id"], ids[1], "tests")
        domain.update_step(conn, seq["id"], ids[2], {"subject": "Edited"}, "tests")
        domain.set_status(conn, seq["id"], "resume", "tests")
    assert _enrollments(engine)[0].step_id == ids[2]
    assert _advance_all(engine) == 1
    assert [j.payload["step_id"] for j in _jobs(engine)] == [ids[2]]
    with engine.begin() as conn:
        domain.set_status(conn, seq["id"], "archive", "tests")
        with pytest.raises(Exception, match="archived"):
            domain.add_step(conn, seq["id"], EMAIL1, "tests")


def test_two_advancers_at_once_make_each_step_once(engine: sa.Engine) -> None:
    list_id = _list(engine)
    _sequence(engine, list_id, steps=[EMAIL1, {"type": "wait", "wait_seconds": 0}, EMAIL2])
    n = 2000
    _add(engine, list_id, [f"c{i}@example.org" for i in range(n)])
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run() -> None:
        try:
            start.wait()
            while sequences.tick(engine, batch=100) > 0:
                pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _advance_all(engine)
    with engine.connect() as conn:
        pairs = conn.execute(sa.text(
            "SELECT count(*), count(DISTINCT (payload->>'enrollment_id', payload->>'step_id')) "
            "FROM delivery_jobs WHERE kind = 'sequence'")).one()
        done = conn.execute(sa.text(
            "SELECT count(*) FROM sequence_enrollments WHERE status = 'done'")).scalar_one()
    assert pairs == (2 * n, 2 * n)
    assert done == n


def test_the_same_step_enqueued_twice_makes_one_job(engine: sa.Engine) -> None:
    list_id = _list(engine)
    seq = _sequence(engine, list_id)
    _add(engine, list_id, ["x@example.org"])
    e = _enrollments(engine)[0]
    step = seq["steps"][0]["id"]
    with engine.begin() as conn:
        first = queue.enqueue_due_steps(conn, [(e.id, step)])
    with engine.begin() as conn:
        second = queue.enqueue_due_steps(conn, [(e.id, step)])
    assert first == second
    assert len(_jobs(engine)) == 1


def _due_plan(conn: sa.Connection) -> str:
    return "\n".join(r[0] for r in conn.execute(sa.text(
        "EXPLAIN " + str(sequences.DUE.text)), {"batch": sequences.BATCH}))


def test_due_query_reads_the_due_index_not_the_table(engine: sa.Engine) -> None:
    list_id = _list(engine)
    seq = _sequence(engine, list_id, steps=[{"type": "wait", "wait_seconds": 86400}, EMAIL1])
    with engine.begin() as conn:
        # 200,000 enrollments: most finished or waiting a day, a few due.
        conn.execute(sa.text(
            "INSERT INTO subscribers (email) SELECT 'p' || i || '@example.org' "
            "FROM generate_series(1, 200000) i"))
        conn.execute(sa.text("""
            INSERT INTO sequence_enrollments (sequence_id, subscriber_id, status, step_id,
                                              due_at, exit_reason)
            SELECT :s, id, CASE WHEN id % 10 = 0 THEN 'active' ELSE 'done' END, :step,
                   now() + CASE WHEN id % 1000 = 0 THEN interval '0' ELSE interval '1 day'
                               END, NULL
              FROM subscribers"""), {"s": seq["id"], "step": seq["steps"][1]["id"]})
        conn.execute(sa.text("ANALYZE sequence_enrollments"))
    with engine.connect() as conn:
        plan = _due_plan(conn)
        conn.execute(sa.text("SET enable_seqscan = off"))
        forced = _due_plan(conn)
    print("\nEXPLAIN of the advancer's due query at 200,000 enrollments:\n" + plan)
    for p in (plan, forced):
        assert "sequence_enrollments_due_idx" in p
        assert "Seq Scan on sequence_enrollments" not in p
    started = time.monotonic()
    with engine.begin() as conn:
        moved = sequences.advance(conn)
    print(f"one tick moved {moved} due enrollments in {time.monotonic() - started:.2f}s")
    assert moved == 200
