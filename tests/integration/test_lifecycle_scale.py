"""The lifecycle at scale, at small sizes: the campaign lifecycle's decisions are one row
(pause, resume, cancel never touch a job), the claim honours them at once, the engine
settles a cancelled campaign's jobs in bounded chunks with exact counts while the page
counts down, and retention rolls finished campaigns and old transactional jobs up without moving a
counter."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser, enqueue_verification, make_campaign
from webapp.domain import campaigns
from webapp.domain.errors import Conflict
from workers import queue
from workers.core.states import CANCELLED, COUNTED, TERMINAL, Campaign
from workers.delivery import lifecycle, retention

N = 60


def _enqueued(engine: sa.Engine, n: int = N, name: str = "Big") -> dict[str, Any]:
    campaign = make_campaign(engine, [f"r{i}@example.net" for i in range(n)], name=name)
    with engine.begin() as conn:
        assert queue.enqueue_broadcast(conn, campaign["broadcast_id"]) is not None
    return campaign


def _claim(engine: sa.Engine, n: int = 1000) -> list[queue.ClaimedJob]:
    with engine.begin() as conn:
        return queue.claim_batch(conn, "test-worker", n, "example.com")


def _jobs_written(engine: sa.Engine, run: Any) -> int:
    """Rows of delivery_jobs the transaction wrote (their xmin is its id; a fresh test
    cluster is in xid epoch 0)."""
    with engine.begin() as conn:
        run(conn)
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs "
            "WHERE xmin::text::bigint = pg_current_xact_id()::text::bigint")).scalar_one())


def _finish(engine: sa.Engine, outcomes: list[queue.Outcome]) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert len(queue.finish(conn, "test-worker", outcomes)) == len(outcomes)


def _counts(engine: sa.Engine, broadcast_id: int) -> tuple[dict[str, int], dict[str, int]]:
    with engine.connect() as conn:
        return (queue.broadcast_counts(conn, broadcast_id),
                queue.broadcast_counts_slow(conn, broadcast_id))


def test_cancel_is_one_row_the_claim_stops_and_the_settler_finishes_with_exact_counts(
        engine: sa.Engine, client: Any, make_user: Any) -> None:
    campaign = _enqueued(engine)
    in_flight = _claim(engine, 5)  # with the relay when the marketer cancels
    assert len(in_flight) == 5
    written = _jobs_written(engine, lambda conn: campaigns.cancel(conn, campaign["id"],
                                                                  actor="m@example.com"))
    assert written == 0  # the decision touches no job, whatever the campaign's size
    with engine.connect() as conn:
        assert campaigns.get(conn, campaign["id"])["status"] == Campaign.CANCELLED
    # Between the decision and the settling, the claim hands out none of its jobs.
    assert _claim(engine) == []
    fast, slow = _counts(engine, campaign["broadcast_id"])
    assert fast == slow and fast["pending"] == N - 5 and fast["sending"] == 5

    # The page is honest while it settles, in both languages.
    browser = Browser(client, make_user("marketer"))
    page = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert 'id="campaign-cancelling"' in page and f"Cancelling: {N - 5} left" in page
    page = browser.get(f"/campaigns/{campaign['id']}?fragment=live",
                       headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert f"Cancelando: quedan {N - 5}" in page

    # The engine settles in bounded chunks: each tick of a tiny chunk moves at most that.
    settler = lifecycle.Settler(engine, chunk=7, budget=0.0)
    assert settler.tick() == 0  # no time budget: nothing done, nothing broken
    settler.budget = 60
    settler.chunk = 7
    with engine.connect() as conn:
        span = lifecycle.settle_span(conn, campaign["broadcast_id"])
        assert span is not None and span[1] - span[0] == N - 1  # one insert, one span
        first = lifecycle.settle_window(conn, campaign["broadcast_id"], span[0] - 1,
                                        span[0] - 1 + 7)
        conn.rollback()
    assert first == 7 - 5  # the window's first five are with the relay
    assert settler.tick() == N - 5
    fast, slow = _counts(engine, campaign["broadcast_id"])
    assert fast == slow and fast["cancelled"] == N - 5 and fast["pending"] == 0
    assert settler.tick() == 0  # nothing left: the next ticks read only the counters

    # The in-flight messages finish; then the campaign's broadcast is closed.
    _finish(engine, [queue.Outcome(j.id, j.claim_token, "sent", True, reply_class="sent")
                     for j in in_flight])
    with engine.begin() as conn:
        queue.complete_finished_campaigns(conn)
        finished = conn.execute(sa.text("SELECT finished_at FROM broadcasts WHERE id = :b"),
                                {"b": campaign["broadcast_id"]}).scalar_one()
        assert finished is not None
    fast, slow = _counts(engine, campaign["broadcast_id"])
    assert fast == slow == {**dict.fromkeys(COUNTED, 0), "sent": 5, "cancelled": N - 5}
    page = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert "campaign-cancelling" not in page
    with pytest.raises(Conflict):
        with engine.begin() as conn:
            campaigns.cancel(conn, campaign["id"])


def test_a_job_put_back_behind_the_cursor_is_settled_too(engine: sa.Engine) -> None:
    campaign = _enqueued(engine, 30)
    claimed = _claim(engine, 3)
    with engine.begin() as conn:
        campaigns.cancel(conn, campaign["id"])
    settler = lifecycle.Settler(engine, chunk=10, budget=60)
    assert settler.tick() == 27
    with engine.begin() as conn:  # a shutdown hands its claims back: `pending` again
        queue.release(conn, claimed)
    assert settler.tick() == 3
    fast, slow = _counts(engine, campaign["broadcast_id"])
    assert fast == slow and fast["cancelled"] == 30


def test_pause_resume_and_cancel_after_pause_are_one_row_each(engine: sa.Engine) -> None:
    campaign = _enqueued(engine)
    cid = campaign["id"]
    assert _jobs_written(engine, lambda c: campaigns.pause(c, cid, actor="m")) == 0
    assert _claim(engine) == []
    assert _jobs_written(engine, lambda c: campaigns.resume(c, cid, actor="m")) == 0
    assert len(_claim(engine, 4)) == 4
    assert _jobs_written(engine, lambda c: campaigns.pause(c, cid, actor="m")) == 0
    with pytest.raises(Conflict):
        with engine.begin() as conn:
            campaigns.pause(conn, cid)
    assert _jobs_written(engine, lambda c: campaigns.cancel(c, cid, actor="m")) == 0
    assert _claim(engine) == []
    with pytest.raises(Conflict):
        with engine.begin() as conn:
            campaigns.resume(conn, cid)
    assert lifecycle.Settler(engine, budget=60).tick() == N - 4
    with engine.connect() as conn:
        actions = [r.action for r in conn.execute(sa.text(
            "SELECT action FROM audit_log WHERE target = :t ORDER BY id"),
            {"t": f"campaign:{cid}"})]
    assert actions == ["campaign.create", "campaign.send", "campaign.pause", "campaign.resume",
                       "campaign.pause", "campaign.cancel"]


def test_the_engine_pauses_through_the_same_function_with_its_reason(engine: sa.Engine) -> None:
    campaign = _enqueued(engine, 5)
    with engine.begin() as conn:
        assert lifecycle.pause_campaign(conn, campaign["id"], "the relay refuses x", "system")
        assert not lifecycle.pause_campaign(conn, campaign["id"], "again", "system")
        row = campaigns.get(conn, campaign["id"])
        details = conn.execute(sa.text(
            "SELECT details FROM audit_log WHERE action = 'campaign.pause'")).scalar_one()
    assert row["status"] == Campaign.PAUSED and row["paused_reason"] == "the relay refuses x"
    assert details == {"reason": "the relay refuses x"}
    assert _claim(engine) == []
    with engine.begin() as conn:
        campaigns.resume(conn, campaign["id"])
        assert campaigns.get(conn, campaign["id"])["paused_reason"] is None


_CLASS = {"sent": "sent", "failed": "rejected", "bounced": "hard_bounce"}


def _finish_all(engine: sa.Engine, statuses: dict[int, str]) -> None:
    jobs = _claim(engine, 10_000)
    _finish(engine, [
        queue.Outcome(j.id, j.claim_token, statuses.get(i, "sent"), True,
                      reply_class=_CLASS[statuses.get(i, "sent")],
                      error="550 no such user" if statuses.get(i) == "failed" else None)
        for i, j in enumerate(sorted(jobs, key=lambda j: j.id))])
    with engine.begin() as conn:
        queue.complete_finished_campaigns(conn)


def test_retention_rolls_a_finished_campaign_up_and_keeps_its_counts(engine: sa.Engine) -> None:
    old = _enqueued(engine, 40, name="Old")
    _finish_all(engine, {0: "failed", 1: "failed", 2: "bounced"})
    recent = _enqueued(engine, 10, name="Recent")
    _finish_all(engine, {})
    with engine.begin() as conn:
        # A complaint points at one sent job: the event and its job stay.
        job_id = conn.execute(sa.text(
            "SELECT id FROM delivery_jobs WHERE broadcast_id = :b AND status = 'sent' "
            "ORDER BY id LIMIT 1"), {"b": old["broadcast_id"]}).scalar_one()
        conn.execute(sa.text(
            "INSERT INTO job_events (job_id, source, type, email, effect) "
            "VALUES (:j, 'mailbox', 'complaint', 'r3@example.net', 'recorded')"), {"j": job_id})
        conn.execute(sa.text("UPDATE broadcasts SET finished_at = now() - interval '31 days' "
                             "WHERE id = :b"), {"b": old["broadcast_id"]})
        # Transactional jobs: one finished 100 days ago, one recent, one old but waiting.
        for days, status in ((100, "sent"), (1, "sent"), (100, "pending")):
            conn.execute(sa.text(
                "INSERT INTO delivery_jobs (kind, priority, status, email, created_at, "
                "finished_at) VALUES ('verification', 0, :s, 'u@example.org', "
                "now() - make_interval(days => :d), CASE WHEN :s = 'sent' THEN now() END)"),
                {"s": status, "d": days})
    before = _counts(engine, old["broadcast_id"])[0]
    with engine.connect() as conn:
        kinds_before = conn.execute(sa.text(
            "SELECT status, sum(n) FROM kind_counts WHERE kind = 'verification' "
            "GROUP BY status")).all()
    service = retention.Retention(engine, campaign_days=30, transactional_days=90, chunk=6,
                                  budget=60)
    done = service.tick()
    assert done == {"campaign_rows": 36, "campaigns": 1, "transactional_rows": 1}
    assert _counts(engine, old["broadcast_id"])[0] == before  # exact, rows gone or not
    assert before["sent"] == 37 and before["failed"] == 2 and before["bounced"] == 1
    with engine.connect() as conn:
        kept = conn.execute(sa.text(
            "SELECT status, count(*) FROM delivery_jobs WHERE broadcast_id = :b "
            "GROUP BY status ORDER BY status"), {"b": old["broadcast_id"]}).all()
        assert [tuple(r) for r in kept] == [("bounced", 1), ("failed", 2), ("sent", 1)]
        assert conn.execute(sa.text("SELECT count(*) FROM delivery_jobs WHERE broadcast_id = :b"),
                            {"b": recent["broadcast_id"]}).scalar_one() == 9  # one bounced
        assert conn.execute(sa.text("SELECT rolled_up_at IS NOT NULL FROM broadcasts "
                                    "WHERE id = :b"), {"b": old["broadcast_id"]}).scalar_one()
        left = conn.execute(sa.text(
            "SELECT status FROM delivery_jobs WHERE kind = 'verification' ORDER BY status")
        ).scalars().all()
        assert left == ["pending", "sent"]
        kinds_after = conn.execute(sa.text(
            "SELECT status, sum(n) FROM kind_counts WHERE kind = 'verification' "
            "GROUP BY status")).all()
        assert sorted(kinds_after) == sorted(kinds_before)
        inbox_rows = conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE status IN ('failed', 'bounced')")
        ).scalar_one()
        assert inbox_rows == 3
    assert service.tick() == dict.fromkeys(("campaign_rows", "campaigns",
                                            "transactional_rows"), 0)
    assert set(TERMINAL) >= set(retention.DROPPED) and CANCELLED in retention.DROPPED
    assert json.dumps(done)  # the figures the log line prints


def test_retention_zero_keeps_everything(engine: sa.Engine) -> None:
    campaign = _enqueued(engine, 5)
    _finish_all(engine, {})
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE broadcasts SET finished_at = now() - interval '400 days' "
                             "WHERE id = :b"), {"b": campaign["broadcast_id"]})
    service = retention.Retention(engine, campaign_days=0, transactional_days=0, budget=60)
    assert service.tick() == dict.fromkeys(("campaign_rows", "campaigns",
                                            "transactional_rows"), 0)


def _entries_read(engine: sa.Engine, run: Any) -> int:
    """Rows and index entries of delivery_jobs read by ``run`` (sequential scans count
    every row they pass; PostgreSQL's statistics views)."""
    def read() -> int:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            return int(conn.execute(sa.text(
                "SELECT coalesce(sum(idx_tup_read), 0) + (SELECT seq_tup_read "
                "FROM pg_stat_user_tables WHERE relname = 'delivery_jobs') "
                "FROM pg_stat_user_indexes WHERE relname = 'delivery_jobs'")).scalar_one())
    before = read()
    with engine.connect() as conn:
        run(conn)
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    return read() - before


def test_the_jobs_browser_pages_a_big_campaign_along_its_index(engine: sa.Engine) -> None:
    """The Waiting tab reads one page's worth of index entries per open campaign, on the
    first page and deep in a campaign's range alike (it sorted every waiting job)."""
    from webapp.domain import jobs

    big = _enqueued(engine, 3000, name="Big")
    with engine.begin() as conn:
        enqueue_verification(conn, "v@example.org", "u1")
        conn.execute(sa.text("ANALYZE delivery_jobs"))
    pages: list[dict[str, Any]] = []
    filters = jobs.Filters()
    first = _entries_read(engine, lambda c: pages.append(jobs.page(c, "waiting",
                                                                        filters)))
    assert [r["email"] for r in pages[0]["rows"]][:2] == ["v@example.org", "r0@example.net"]
    cursor = pages[0]["next"]
    with engine.connect() as conn:
        for _ in range(20):  # 20 pages in
            cursor = jobs.page(conn, "waiting", filters, cursor)["next"]
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))  # counted before `deep`
        conn.commit()
    deep = _entries_read(engine, lambda c: pages.append(jobs.page(c, "waiting", filters,
                                                                       cursor)))
    emails = [r["email"] for r in pages[1]["rows"]]
    assert len(emails) == jobs.PAGE_SIZE and len(set(emails)) == jobs.PAGE_SIZE
    one = jobs.Filters(campaign_id=big["id"], broadcast_id=big["broadcast_id"])
    filtered = _entries_read(engine, lambda c: jobs.page(c, "waiting", one, cursor))
    print(f"\nindex entries read, 3,000 waiting: first {first}, deep {deep}, "
          f"campaign filter {filtered}")
    assert max(first, deep, filtered) < 4 * jobs.PAGE_SIZE


def test_the_enqueue_goes_through_the_list_in_chunks_with_the_same_result(
        engine: sa.Engine) -> None:
    """Chunk by chunk (each its own transaction in the engine), the audience and its
    summary are exactly what one pass gives; jobs are claimable from the first chunk; a
    finished broadcast is not enqueued again."""
    from webapp.domain import suppressions

    emails = [f"c{i:02d}@example.net" for i in range(30)]
    campaign = make_campaign(engine, emails, name="Chunked")
    with engine.begin() as conn:
        suppressions.suppress(conn, "c03@example.net", "manual", actor="t")
        conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                             "WHERE email IN ('c04@example.net', 'c05@example.net')"))
    b = campaign["broadcast_id"]
    steps = []
    with engine.begin() as conn:
        steps.append(queue.enqueue_chunk(conn, b, 7))
    # c00..c06: c03 suppressed, c04 and c05 unsubscribed.
    assert steps[0] is not None and not steps[0].done and steps[0].added == 4
    assert len(_claim(engine, 100)) == 4  # sending starts before the enqueue ends
    while not steps[-1].done:  # type: ignore[union-attr]
        with engine.begin() as conn:
            steps.append(queue.enqueue_chunk(conn, b, 7))
    assert len(steps) == 5  # 30 members: 7+7+7+7+2
    assert steps[-1].summary() == {"total": 27, "skipped_suppressed": 1,  # type: ignore[union-attr]
                                   "skipped_inactive": 2}
    with engine.begin() as conn:
        assert queue.enqueue_chunk(conn, b, 7) is None
        assert queue.enqueue_broadcast(conn, b) is None
        jobs = conn.execute(sa.text("SELECT email FROM delivery_jobs WHERE broadcast_id = :b"),
                            {"b": b}).scalars().all()
    assert sorted(jobs) == sorted(set(emails) - {"c03@example.net", "c04@example.net",
                                                 "c05@example.net"})


def test_a_big_campaign_does_not_fill_the_transactional_backlog(
        engine: sa.Engine, config_for: Any, sink: Any) -> None:
    """SENDDOCK_MAX_BACKLOG bounds transactional mail; a campaign's waiting jobs (ten
    million of them at docs/design.md §26's size) must not make verification mail refused (P7)."""
    from webapp.domain import limits
    from webapp.domain.errors import Overloaded

    config = config_for(sink.port, MAX_BACKLOG="3")
    _enqueued(engine, 20)
    with engine.connect() as conn:
        assert queue.backlog(conn) == 20
        limits.check_backlog(conn, config)  # 20 campaign jobs waiting: not refused
    with engine.begin() as conn:
        for i in range(3):
            enqueue_verification(conn, f"v{i}@example.org", f"u{i}")
    with engine.connect() as conn, pytest.raises(Overloaded):
        limits.check_backlog(conn, config)


def test_a_settle_chunk_and_a_roll_up_chunk_deep_in_a_campaign_read_only_their_rows(
        engine: sa.Engine) -> None:
    """Each chunk costs its own rows, wherever it is in the campaign: a chunk merged with
    the primary key from its start read every row before it (a 1M cancel crawled)."""
    campaign = _enqueued(engine, 4000, name="Deep")
    b = campaign["broadcast_id"]
    with engine.begin() as conn:
        campaigns.cancel(conn, campaign["id"])
        conn.execute(sa.text("ANALYZE delivery_jobs"))
    with engine.begin() as conn:
        span = lifecycle.settle_span(conn, b)
        assert span is not None
        cursor = span[0] - 1
        for _ in range(3):
            assert lifecycle.settle_window(conn, b, cursor, cursor + 1000) == 1000
            cursor += 1000
        conn.execute(sa.text("ANALYZE delivery_jobs"))
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))  # counted before
    def big(conn: sa.Connection) -> sa.Connection:
        # At 4,000 rows a sequential scan is cheapest; at millions the planner takes the
        # indexes, which is what is measured here.
        conn.execute(sa.text("SET enable_seqscan = off"))
        return conn

    done: list[int] = []
    read = _entries_read(engine, lambda c: done.append(lifecycle.settle_window(
        big(c), b, cursor, cursor + 200)))
    assert done[0] == 200
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE broadcasts SET finished_at = now() - interval '40 days' "
                             "WHERE id = :b"), {"b": b})
        lifecycle.settle_window(conn, b, span[0] - 1, span[1])
        after = retention.START
        for _ in range(3):
            after = retention.roll_up_chunk(conn, b, after, 1000)[1]  # type: ignore[assignment]
        conn.execute(sa.text("ANALYZE delivery_jobs"))
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))  # counted before
    rolled: list[tuple[int, Any]] = []
    read_rollup = _entries_read(engine, lambda c: rolled.append(
        retention.roll_up_chunk(big(c), b, after, 200)))
    print(f"\nentries read by a 200-row chunk 3,000 rows in: settle {read}, roll-up "
          f"{read_rollup}")
    assert rolled[0][0] == 200
    assert read < 1000 and read_rollup < 1000, (read, read_rollup)


def test_the_jobs_browser_address_filter_reads_only_the_address_index(
        engine: sa.Engine) -> None:
    """An address is looked up on delivery_jobs_email_idx on every tab, with its counts:
    transactional jobs and a campaign's retrying ones are found; a campaign's waiting
    jobs are not searched (at 10M that read the campaign's whole waiting range)."""
    from tests.helpers import place_jobs
    from webapp.domain import jobs

    big = _enqueued(engine, 3000, name="Big")
    with engine.begin() as conn:
        enqueue_verification(conn, "R7@example.net", "u7")
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'retry' "
                                 "WHERE broadcast_id = :b AND email = 'r8@example.net'"),
                   {"b": big["broadcast_id"]})
        conn.execute(sa.text("ANALYZE delivery_jobs"))
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))  # counted before
    found: dict[str, Any] = {}

    def browse(conn: sa.Connection) -> None:
        # At 3,000 rows a sequential scan is cheapest; at millions the planner takes the
        # index, which is what is measured here.
        conn.execute(sa.text("SET enable_seqscan = off"))
        for address in ("r7@example.net", "r8@example.net"):
            f = jobs.parse_filters(conn, {"q": address})
            found[address] = (jobs.counts(conn, f),
                              [(r["kind"], r["status"])
                               for tab in ("waiting", "retrying")
                               for r in jobs.page(conn, tab, f)["rows"]])

    read = _entries_read(engine, browse)
    # r7 has a waiting campaign job too: not searched; its verification is.
    assert found["r7@example.net"][1] == [("verification", "pending")]
    assert found["r7@example.net"][0]["waiting"] == 1
    assert found["r8@example.net"][1] == [("broadcast", "retry")]
    assert found["r8@example.net"][0]["retrying"] == 1
    assert found["r8@example.net"][0]["waiting"] == 0
    print(f"\nentries read by two address searches (counts and two tabs), 3,000 waiting: "
          f"{read}")
    assert read < 100, read


def test_the_settler_streams_take_disjoint_windows_and_together_every_job_once(
        engine: sa.Engine) -> None:
    """Two sessions settle one cancelled campaign at once, each taking the next window of
    its span of ids: the windows are disjoint and cover the span; every waiting job is
    settled exactly once, a transactional job inside the span is untouched, a job that
    was with the relay and comes back `pending` is settled by the next pass, and the
    counters equal GROUP BY status."""
    campaign = make_campaign(engine, [f"w{i}@example.net" for i in range(3000)],
                             name="Windows")
    b = campaign["broadcast_id"]
    with engine.begin() as conn:  # enqueued in three chunks, transactional mail between
        for i in range(3):
            step = queue.enqueue_chunk(conn, b, 1000)
            assert step is not None and step.added == 1000
            enqueue_verification(conn, f"v{i}@example.org", f"u{i}")
        first, last, lo, hi = conn.execute(sa.text(
            "SELECT b.first_job_id, b.last_job_id, min(j.id), max(j.id) FROM broadcasts b "
            "JOIN delivery_jobs j ON j.broadcast_id = b.id WHERE b.id = :b "
            "GROUP BY b.id"), {"b": b}).one()
    assert (first, last) == (lo, hi) and last - first == 3001  # two verifications in it
    claimed = _claim(engine, 7)  # the three verifications first (P7), four campaign jobs
    assert sorted(j.kind for j in claimed) == ["broadcast"] * 4 + ["verification"] * 3
    with engine.begin() as conn:
        campaigns.cancel(conn, campaign["id"])
    windows: list[tuple[int, int]] = []
    take = lifecycle.Sweep.take

    def recording(sweep: lifecycle.Sweep, size: int) -> tuple[int, int] | None:
        window = take(sweep, size)
        if window is not None:
            windows.append(window)
        return window

    settler = lifecycle.Settler(engine, chunk=250, budget=60, streams=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lifecycle.Sweep, "take", recording)
        assert settler.tick() == 3000 - 4
    windows.sort()
    assert windows[0][0] == first - 1 and windows[-1][1] == last
    assert all(a[1] == b_[0] for a, b_ in itertools.pairwise(windows))
    fast, slow = _counts(engine, b)
    assert fast == slow and fast["cancelled"] == 3000 - 4 and fast["sending"] == 4
    with engine.begin() as conn:  # a shutdown hands its claims back: `pending` again
        queue.release(conn, claimed)
    assert settler.tick() == 4
    assert settler.tick() == 0
    fast, slow = _counts(engine, b)
    assert fast == slow and fast["cancelled"] == 3000 and fast["pending"] == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT array_agg(status ORDER BY id) FROM delivery_jobs "
            "WHERE kind = 'verification'")).scalar_one() == ["pending"] * 3


def test_a_broadcast_enqueued_before_its_span_was_recorded_is_settled_too(
        engine: sa.Engine) -> None:
    """A broadcast enqueued by a release without the span (first_job_id NULL): the span is
    read from its waiting jobs."""
    campaign = _enqueued(engine, 50)
    b = campaign["broadcast_id"]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE broadcasts SET first_job_id = NULL, last_job_id = NULL "
                             "WHERE id = :b"), {"b": b})
        campaigns.cancel(conn, campaign["id"])
    assert lifecycle.Settler(engine, chunk=7, budget=60).tick() == 50
    fast, slow = _counts(engine, b)
    assert fast == slow and fast["cancelled"] == 50
