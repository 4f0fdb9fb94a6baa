"""docs/design.md §17 on PostgreSQL itself: one shared pause state that escalates once per probe
cycle (compare-and-set: threads and processes that see the same reply at the same moment
count once), and a throttling relay's pace (AIMD) shared by every process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import waiting_on_a_lock
from workers import queue
from workers.core import pg
from workers.delivery.maintenance import Maintenance

THREADS = 8


def at_once(engine: sa.Engine, work: Callable[[sa.Connection], Any]) -> list[Any]:
    """``work`` on THREADS sessions of their own, released together, each committed."""
    barrier = threading.Barrier(THREADS)
    results: list[Any] = [None] * THREADS

    def run(i: int) -> None:
        with engine.connect() as conn:
            barrier.wait()
            with conn.begin():
                results[i] = work(conn)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def relay(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return queue.relay_status(conn)


def test_relay_down_seen_by_every_thread_counts_once(engine: sa.Engine) -> None:
    """Eight threads see the relay go down at the same moment: one failure, one backoff
    step. Only a failed probe after it escalates."""
    failures = at_once(engine, lambda c: queue.mark_relay_down(c, "421 4.3.2 going down"))
    row = relay(engine)
    assert row["status"] == "down" and row["failures"] == 1 and set(failures) == {1}
    first_probe = row["next_probe_at"]
    at_once(engine, lambda c: queue.mark_relay_down(c, "421 4.3.2 still down"))
    row = relay(engine)
    assert row["failures"] == 1 and row["next_probe_at"] == first_probe
    with engine.begin() as conn:
        assert queue.mark_relay_down(conn, "421 probe refused", probe=True) == 2
    assert relay(engine)["next_probe_at"] > first_probe
    # a refused login is a new reason: it takes its own (longer) probe interval at once
    with engine.begin() as conn:
        assert queue.mark_relay_down(conn, "535 5.7.8 no", login=True) == 3
    assert relay(engine)["reason"] == "login"


def test_a_domain_pause_escalates_once_per_cycle(engine: sa.Engine) -> None:
    backoff = (30, 60, 120)
    delays = at_once(engine, lambda c: queue.throttle_domain(c, "slow.example",
                                                             "450 4.7.0 slow down", backoff))
    assert sorted(delays, key=lambda d: d is None) == [30.0] + [None] * (THREADS - 1)
    with engine.connect() as conn:
        [row] = queue.domain_throttles(conn)
    assert row["hits"] == 1 and row["active"]
    # during the pause: replies to sends started before it change nothing
    with engine.begin() as conn:
        assert queue.throttle_domain(conn, "slow.example", "450 again", backoff) is None
    # the pause is over and the next try is refused again: one step further, once
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE domain_throttles SET until = now() - interval '1s'"))
    delays = at_once(engine, lambda c: queue.throttle_domain(c, "slow.example",
                                                             "450 4.7.0 slow down", backoff))
    assert sorted(delays, key=lambda d: d is None) == [60.0] + [None] * (THREADS - 1)
    with engine.connect() as conn:
        assert queue.domain_throttles(conn)[0]["hits"] == 2


def test_a_closing_relay_pauses_once_per_cycle(engine: sa.Engine) -> None:
    """421 (the relay closed the channel): every thread's 421 at once is one pause step."""
    at_once(engine, lambda c: queue.throttle_relay(c, "421 4.7.0 Try later", (5, 10, 20),
                                                   pause=True))
    row = relay(engine)
    assert row["pause_hits"] == 1 and row["paused"] and row["throttled"]
    assert row["throttle_hits"] == 1  # one throttling cycle counted, not eight


def test_pacing_halves_once_per_moment_and_grows_back(engine: sa.Engine) -> None:
    """AIMD on the shared row: eight threads' throttle replies at one moment halve the rate
    once; a clean interval grows it back by a step; back at the limit, pacing ends. Every
    process's permits follow the rate in force."""
    rates = at_once(engine, lambda c: queue.throttle_relay(c, "450 4.7.1 too many", (30,),
                                                           rate_limit=8))
    assert sorted(rates, key=lambda r: r is None) == [4.0] + [None] * (THREADS - 1)
    row = relay(engine)
    assert row["paced_rate"] == 4.0 and row["throttled"] and not row["paused"]
    with engine.begin() as conn:
        permits = queue.acquire_permits(conn, 10, 8)
    assert permits.rate == 4.0 and permits.interval == 0.25  # the pace, not the limit

    def age(seconds: float) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE rate_limiter SET paced_at = paced_at - "
                                 "make_interval(secs => :s)"), {"s": seconds})

    age(1.1)  # a second later the relay still throttles: halve again
    with engine.begin() as conn:
        assert queue.throttle_relay(conn, "450 4.7.1 too many", (30,), rate_limit=8) == 2.0
    for expected in (3.6, 5.2, 6.8):  # step: 8 / PACE_STEPS, once per clean interval
        age(queue.PACE_CLEAN_INTERVAL + 0.1)
        with engine.begin() as conn:
            assert abs(queue.acquire_permits(conn, 1, 8).rate - expected) < 1e-9
    with engine.begin() as conn:  # no clean interval since: no growth
        assert abs(queue.acquire_permits(conn, 1, 8).rate - 6.8) < 1e-9
    age(queue.PACE_CLEAN_INTERVAL + 0.1)
    with engine.begin() as conn:
        assert queue.acquire_permits(conn, 1, 8).rate == 8  # back at the limit: pacing ends
        assert queue.paced_rate(conn) is None
    assert not relay(engine)["throttled"]


def test_pacing_without_a_limit_starts_from_the_measured_rate(engine: sa.Engine) -> None:
    """No SENDDOCK_RATE_LIMIT: the first halving halves the rate measured over the last
    seconds (messages sent), so pacing starts near what the relay was taking."""
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, email, status, finished_at)
            SELECT 'verify', 0, 'm' || i || '@example.org', 'sent', now()
              FROM generate_series(1, 20) i"""))
        rate = queue.throttle_relay(conn, "450 4.7.1 too many recipients from 127.0.0.1",
                                    (30,))
    assert rate == 2.0  # 20 sent in the last 5 s = 4/s, halved
    with engine.begin() as conn:
        assert queue.acquire_permits(conn, 1, 0).rate == 2.0


def test_the_pace_in_force_is_on_queue_health_and_in_metrics(engine: sa.Engine, client: Any,
                                                               make_user: Any) -> None:
    from tests.helpers import Browser
    from webapp.domain import health

    health._alarm_cache.clear()
    admin = Browser(client, make_user("admin"))
    assert "senddock_relay_paced_rate 0.0" in admin.get("/metrics").get_data(as_text=True)
    with engine.begin() as conn:
        queue.throttle_relay(conn, "450 4.7.1 Error: too many recipients from 127.0.0.1",
                             (30,), rate_limit=8)
    health._alarm_cache.clear()
    page = admin.get("/health/").get_data(as_text=True)
    assert 'id="relay-paced-rate">4.00<' in page
    assert 'data-alarm="relay_throttled"' in page and "paced at 4.00 messages per second" in page
    assert "senddock_relay_paced_rate 4.0" in admin.get("/metrics").get_data(as_text=True)


def test_maintenance_prunes_the_domain_throttles_that_ended_a_day_ago(
        engine: sa.Engine) -> None:
    """A domain's throttle row outlives its pause by a day (Queue health lists the last
    hour's); Maintenance's hourly prune removes the older ones, so the table does not keep
    a row for every domain that ever throttled us."""
    with engine.begin() as conn:
        for domain in ("old.example", "recent.example", "paused.example"):
            queue.throttle_domain(conn, domain, "421 slow down", [60])
        conn.execute(sa.text("UPDATE domain_throttles SET until = now() - interval '2 days' "
                             "WHERE domain = 'old.example'"))
        conn.execute(sa.text("UPDATE domain_throttles SET until = now() - interval '2 hours' "
                             "WHERE domain = 'recent.example'"))

    def domains() -> set[str]:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SELECT domain FROM domain_throttles")).scalars())

    maintenance = Maintenance(engine, pg.Outage("test", logging.getLogger("test")),
                              threading.Event())
    maintenance.run()
    assert domains() == {"recent.example", "paused.example"}
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE domain_throttles SET until = now() - interval '3 days' "
                             "WHERE domain = 'recent.example'"))
    maintenance.run()  # within the hour: nothing pruned
    assert domains() == {"recent.example", "paused.example"}
    maintenance._prune_at = time.monotonic()  # an hour later
    maintenance.run()
    assert domains() == {"paused.example"}


def test_a_claim_that_waited_on_another_counts_its_sends_against_the_hour(
        engine: sa.Engine) -> None:
    """The hourly and daily limits hold across processes: a claim that waited for another
    one's lock on the rate row must then see what that one took (a statement that waited
    on a lock still reads with the snapshot it started with)."""
    holder = engine.connect()
    holder.begin()
    assert queue.acquire_permits(holder, 20, 0, per_hour=25).granted == 20
    granted: list[int] = []

    def other() -> None:
        with engine.begin() as conn:
            granted.append(queue.acquire_permits(conn, 10, 0, per_hour=25).granted)

    thread = threading.Thread(target=other)
    thread.start()
    wait_for(lambda: waiting_on_a_lock(engine), timeout=30,
             message="the second grant to wait on the lock")
    holder.commit()
    holder.close()
    thread.join(30)
    assert granted == [5], "the hour's limit of 25 was handed out twice"
