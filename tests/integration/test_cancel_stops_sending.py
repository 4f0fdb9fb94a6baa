"""After a cancel (or a pause) commits, no campaign message may start;
only those inside an SMTP transaction at that instant finish (at most one per drain
thread), and the cancel says how many. Real PostgreSQL, the real pool, a real SMTP sink
that takes 20 ms per message and records when each message's MAIL FROM arrived."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import make_campaign
from webapp.domain import campaigns
from workers.core.settings import Config
from workers.delivery import lifecycle, send_guard
from workers.delivery.pool import Pool

N = 400
WORKERS = 4


def _counts(engine: sa.Engine, campaign_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(  # type: ignore[arg-type]
            "SELECT status, count(*) FROM delivery_jobs WHERE campaign_id = :c "
            "GROUP BY status"), {"c": campaign_id}).all())


def _stop_mid_send(engine: sa.Engine, sink: Any, config_for: Callable[..., Config],
                   action: Callable[..., dict[str, Any]]) -> None:
    sink.set_rules({"delay": 0.02})
    campaign = make_campaign(engine, [f"r{i}@example.org" for i in range(N)])
    pool = Pool(engine, config_for(sink.port, WORKERS=str(WORKERS)), node="test-node")
    pool.start()
    try:
        wait_for(lambda: len(sink.records()) >= 60, timeout=60,
                 message="the campaign to be sending")
        with engine.begin() as conn:
            result = action(conn, campaign["id"], actor="marketer")
        committed = datetime.now(UTC)  # the commit has returned
        at_commit = len(sink.records())
        assert 0 <= result["in_flight"] <= WORKERS
        # The pool goes on draining other work; the campaign's claimed jobs go back
        # unsent (and a cancel's waiting ones are settled): wait until none is in hand.
        wait_for(lambda: not _counts(engine, campaign["id"]).get("sending"), timeout=60,
                 message="no job of the campaign in hand")
        time.sleep(0.3)  # anything a worker still had would reach the sink by now
        records = sink.records()
    finally:
        pool.stop()
    late = [r for r in records
            if datetime.fromisoformat(r["started"]) >= committed
            or datetime.fromisoformat(r["time"]) >= committed]
    assert late == [], f"{len(late)} message(s) started after the commit: {late[:3]}"
    assert len(records) == at_commit < N
    counts = _counts(engine, campaign["id"])
    assert counts.get("sent", 0) == len(records), counts


def test_no_message_starts_after_a_cancel_commits(engine: sa.Engine, sink: Any,
                                                  config_for: Callable[..., Config]) -> None:
    _stop_mid_send(engine, sink, config_for, campaigns.cancel)


def test_no_message_starts_after_a_pause_commits(engine: sa.Engine, sink: Any,
                                                 config_for: Callable[..., Config]) -> None:
    _stop_mid_send(engine, sink, config_for, campaigns.pause)


def test_the_guard_says_no_once_stopped_and_counts_who_is_in_flight(
        engine: sa.Engine, db_url: str) -> None:
    from workers.core import pg

    campaign = make_campaign(engine, ["a@example.org"])
    info = pg.engine_conninfo(engine)
    first = send_guard.SendGuard(info, "test-guard-1")
    second = send_guard.SendGuard(info, "test-guard-2")
    try:
        assert first.enter(campaign["id"]) and second.enter(campaign["id"])
        with engine.connect() as conn:
            count = conn.execute(lifecycle._IN_FLIGHT, {
                "high": send_guard.guard_key(campaign["id"]) >> 32,
                "low": send_guard.guard_key(campaign["id"]) & 0xFFFFFFFF}).scalar_one()
        assert count == 2  # one per drain thread's session
        first.leave()
        second.leave()  # (the releases are written, not waited for)
        for _ in range(600):
            if not _locks_held(engine, campaign["id"]):
                break
            time.sleep(0.01)
        with engine.begin() as conn:
            assert campaigns.cancel(conn, campaign["id"], actor="t")["in_flight"] == 0
        assert not first.enter(campaign["id"])  # cancelled: no message starts
        assert getattr(first.local, "held", None) is None
        # While a cancel waits for the lock, a new message does not start either.
        other = make_campaign(engine, ["b@example.org"], name="Other")
        with engine.begin() as conn:
            lifecycle.stop_sending(conn, other["id"])
            assert not first.enter(other["id"])
        assert first.enter(other["id"])  # rolled back: still sending
        first.leave()
    finally:
        first.close()
        second.close()


def test_the_page_says_how_many_were_in_flight(client: Any, engine: sa.Engine,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    from tests.helpers import Browser

    marketer = Browser(client, make_user("marketer"))
    for lang, words in (("en", "Messages in flight at that moment (they finished): 0."),
                        ("es", "Mensajes en curso en ese momento (terminaron): 0.")):
        campaign = make_campaign(engine, [f"x-{lang}@example.org"], name=f"C {lang}")
        page = marketer.client.post(
            f"/campaigns/{campaign['id']}/cancel", data={"csrf_token": marketer.token},
            headers={"Accept-Language": lang}, follow_redirects=True).get_data(as_text=True)
        assert words in page, page


def _waiting_locks(engine: sa.Engine) -> int:
    """Advisory lock requests waiting in the test's database."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())")).scalar_one())


@contextmanager
def _cancel_waiting(engine: sa.Engine, guard: send_guard.SendGuard,
                    campaign_id: int) -> Iterator[list[Any]]:
    """One drain thread inside its SMTP transaction (the guard entered) and a cancel
    waiting for it; the thread leaves on the way out. Yields the answers so far: the
    thread's enter, then (once the cancel went through) its count of messages in flight."""
    entered, release, answers = threading.Event(), threading.Event(), []

    def in_flight() -> None:
        answers.append(guard.enter(campaign_id))
        entered.set()
        release.wait(30)
        guard.leave()

    def cancel() -> None:
        with engine.begin() as conn:
            answers.append(campaigns.cancel(conn, campaign_id, actor="t")["in_flight"])

    holder = threading.Thread(target=in_flight)
    holder.start()
    assert entered.wait(30) and answers == [True]
    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        for _ in range(600):  # until the cancel waits for the lock (bounded by count)
            if _waiting_locks(engine):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the cancel never waited for the lock")
        yield answers
    finally:
        release.set()
        holder.join(30)
        canceller.join(30)


def test_one_guard_session_shared_by_threads_lets_a_waiting_cancel_through(
        engine: sa.Engine) -> None:
    """The drain threads of a process share one guard session, and a session's own lock
    requests are granted at once while it holds the lock: the guard must still say no
    while a cancel waits, or a busy drain would keep the cancel waiting for ever."""
    from workers.core import pg

    campaign = make_campaign(engine, ["c@example.org"], name="Shared")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-shared")
    with _cancel_waiting(engine, guard, campaign["id"]) as answers:
        other = threading.Thread(target=lambda: answers.append(guard.enter(campaign["id"])))
        other.start()
        other.join(30)
        assert answers[-1] is False  # the same session, another thread: no new message
    assert answers[-1] == 1  # the cancel went through, counting the one in flight
    guard.close()


def test_a_pause_waiting_in_another_database_stops_nothing_here(engine: sa.Engine) -> None:
    """Advisory locks are per database, but pg_locks lists every database's: another
    SendDock database on the same server, pausing its campaign of the same id, must
    neither stop this one's messages nor be counted among them."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from workers.core import pg

    campaign = make_campaign(engine, ["d@example.org"], name="Here")
    key = send_guard.guard_key(campaign["id"])
    elsewhere = make_conninfo(pg.engine_conninfo(engine), dbname="postgres")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-here")
    with psycopg.connect(elsewhere, autocommit=True) as holder, \
            psycopg.connect(elsewhere, autocommit=True) as pauser:
        holder.execute("SELECT pg_advisory_lock_shared(%s)", (key,))  # one in flight there
        waiting = threading.Thread(target=lambda: pauser.execute(
            "SELECT pg_advisory_lock(%s)", (key,)))  # and a pause waiting there
        waiting.start()
        try:
            for _ in range(600):  # until the pause there waits (bounded by count)
                if holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                                  "'advisory' AND NOT granted").fetchone() == (1,):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the pause elsewhere never waited")
            assert guard.enter(campaign["id"])  # here the campaign is sending
            guard.leave()
            with engine.begin() as conn:
                assert campaigns.pause(conn, campaign["id"], actor="t")["in_flight"] == 0
        finally:
            holder.execute("SELECT pg_advisory_unlock_shared(%s)", (key,))
            waiting.join(30)
            pauser.execute("SELECT pg_advisory_unlock_all()")
            guard.close()


def test_a_check_never_answered_releases_only_what_it_took(engine: sa.Engine) -> None:
    """A message whose SMTP transaction ends before the relay's 354 (a refused RCPT, a lost
    connection) never reads its check's answer. Its release must not give up the lock the
    shared session holds for another thread's message in flight: the cancel waiting for
    that message would go through while it is still being sent."""
    from workers.core import pg

    campaign = make_campaign(engine, ["e@example.org"], name="Unanswered")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-unanswered")
    with _cancel_waiting(engine, guard, campaign["id"]) as answers:
        # Another thread: its check is written (and refused: the cancel waits), its
        # message ends before the 354, and it leaves without having read the answer.
        other = threading.Thread(target=lambda: (guard.ask(campaign["id"]), guard.leave()))
        other.start()
        other.join(30)
        time.sleep(0.2)
        assert _waiting_locks(engine) == 1 and len(answers) == 1  # the cancel still waits
    assert answers[-1] == 1
    guard.close()


def _locks_held(engine: sa.Engine, campaign_id: int) -> int:
    key = send_guard.guard_key(campaign_id)
    with engine.connect() as conn:
        return int(conn.execute(lifecycle._IN_FLIGHT, {
            "high": key >> 32, "low": key & 0xFFFFFFFF}).scalar_one())


def test_a_held_lock_lets_the_next_messages_go_without_a_statement(
        engine: sa.Engine) -> None:
    """The pool's guard keeps a campaign's lock between its messages: only the first check
    is a statement, and the lock is given back once no message has needed it for
    ``hold`` seconds."""
    from workers.core import pg

    campaign = make_campaign(engine, ["f@example.org"], name="Held")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-held", hold=0.3)
    try:
        assert guard.enter(campaign["id"])
        written = guard.written
        guard.leave()
        for _ in range(20):  # twenty more messages, one after another
            assert guard.enter(campaign["id"])
            guard.leave()
        assert guard.written == written  # none of them asked the database
        assert _locks_held(engine, campaign["id"]) == 1  # kept between messages
        for _ in range(600):  # given back after the hold (bounded by count)
            if not _locks_held(engine, campaign["id"]):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the idle lock was never given back")
        assert not guard._holds
    finally:
        guard.close()


def test_a_pause_goes_through_a_lock_held_between_messages(engine: sa.Engine) -> None:
    """No message in flight, the lock kept for the next one (a long hold): a pause waits
    only until the keeper sees it, and from its commit no message starts."""
    from workers.core import pg

    campaign = make_campaign(engine, ["g@example.org"], name="Idle hold")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-idle", hold=600)
    try:
        assert guard.enter(campaign["id"])
        guard.leave()
        assert _locks_held(engine, campaign["id"]) == 1
        paused: list[dict[str, Any]] = []

        def pause() -> None:
            with engine.begin() as conn:
                paused.append(campaigns.pause(conn, campaign["id"], actor="t"))

        pauser = threading.Thread(target=pause)
        pauser.start()
        pauser.join(30)
        assert paused and paused[0]["status"] == "paused"
        assert paused[0]["in_flight"] == 1  # the session that held it
        assert not guard.enter(campaign["id"])  # paused: no message starts
        assert not _locks_held(engine, campaign["id"])
    finally:
        guard.close()


def test_a_held_lock_stops_new_messages_once_a_cancel_waits(engine: sa.Engine) -> None:
    """A message in flight under a held lock and a cancel waiting for it: once the keeper
    has seen the cancel, the next message's check is a statement again and says no, and
    the cancel goes through when the message in flight has been answered."""
    from workers.core import pg

    campaign = make_campaign(engine, ["h@example.org"], name="Busy hold")
    guard = send_guard.SendGuard(pg.engine_conninfo(engine), "test-guard-busy", hold=600)
    key = send_guard.guard_key(campaign["id"])
    with _cancel_waiting(engine, guard, campaign["id"]) as answers:
        for _ in range(600):  # until the keeper has seen it (bounded by count)
            with guard.lock:
                if guard._holds[key].waited:
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the keeper never saw the waiting cancel")
        other = threading.Thread(target=lambda: answers.append(guard.enter(campaign["id"])))
        other.start()
        other.join(30)
        assert answers[-1] is False
        time.sleep(0.2)
        assert _waiting_locks(engine) == 1  # the message in flight still holds it
    assert answers[-1] == 1
    assert not _locks_held(engine, campaign["id"])
    guard.close()
