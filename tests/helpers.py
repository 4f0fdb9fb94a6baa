"""Shared test helpers: seeding lists and campaigns, reading the queue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import Proc, wait_for
from webapp.domain import campaigns, lists
from workers import queue
from workers.core.states import PRIORITY


def place_jobs(conn: sa.Connection, statement: sa.TextClause,
               params: dict[str, Any] | None = None) -> sa.CursorResult[Any]:
    """Put jobs straight into a state as test data, by a move the engine never makes
    (pending -> sent, sent -> pending, ...): the database's legal-move trigger (migration
    0021_arch) is switched off for this one statement, inside the caller's transaction.
    ALTER TABLE is transactional, so no other session ever sees it off; it holds the
    table's lock until that transaction ends."""
    conn.execute(sa.text("ALTER TABLE delivery_jobs DISABLE TRIGGER delivery_jobs_legal_move"))
    result = conn.execute(statement, params or {})
    conn.execute(sa.text("ALTER TABLE delivery_jobs ENABLE TRIGGER delivery_jobs_legal_move"))
    return result


def enqueue_verification(conn: sa.Connection, email: str, user_ref: str) -> int:
    """One verification job, as the engine's one way into the queue creates it (no
    request rules: the test places it)."""
    result = queue.enqueue_one(conn, queue.Ask("verification", email,
                                                   PRIORITY["verification"], {},
                                                   user_ref=user_ref), actor=None)
    assert result.outcome == "new" and result.job is not None, result
    return int(result.job["id"])


def make_campaign(engine: sa.Engine, emails: list[str], *, send: bool = True,
                  name: str = "Test campaign") -> dict[str, Any]:
    with engine.begin() as conn:
        taken = conn.execute(sa.text("SELECT count(*) FROM lists WHERE lower(name) LIKE "
                                     "lower(:n) || '%'"), {"n": f"{name} list"}).scalar()
        # List names are unique: a second campaign of the same name gets "… list 2".
        lst = lists.create_list(conn, f"{name} list" + (f" {taken + 1}" if taken else ""))
        result = lists.add_subscribers(conn, lst["id"], [{"email": e, "name": e.split("@")[0]}
                                                         for e in emails])
        assert not result["errors"], result["errors"]
        campaign = campaigns.create(conn, {
            "name": name, "list_id": lst["id"], "subject": "Hello {{ name }}",
            "text": "Hi {{ name }}, unsubscribe: {{ unsubscribe_url }}",
            "html": "<p>Hi {{ name }}</p>"}, default_from="news@example.com")
        if send:
            campaign = campaigns.send(conn, campaign["id"])
    return campaign


def jobs_by_email(engine: sa.Engine, campaign_id: int) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE campaign_id = :c"), {"c": campaign_id})
        return {r["email"]: dict(r) for r in rows.mappings()}


def attempts_of(engine: sa.Engine, job_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT * FROM job_attempts WHERE job_id = :j ORDER BY attempt"), {"j": job_id})
        return [dict(r) for r in rows.mappings()]


def campaign_status(engine: sa.Engine, campaign_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT status FROM campaigns WHERE id = :id"),
                                {"id": campaign_id}).scalar_one())


def suppressed(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT email FROM suppressions")).scalars())


class Browser:
    """A logged-in test client that sends the page's CSRF token with its forms."""

    def __init__(self, client: Any, user: dict[str, Any]) -> None:
        import re

        self.client = client
        page = client.get("/login").get_data(as_text=True)
        found = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert found, page
        self.token = found[1]
        r = client.post("/login", data={"email": user["email"], "password": user["password"],
                                        "csrf_token": self.token})
        assert r.status_code == 302, r.get_data(as_text=True)
        # A login starts a new session with a new CSRF token.
        found = re.search(r'name="csrf-token" content="([^"]+)"',
                          client.get("/account/").get_data(as_text=True))
        assert found
        self.token = found[1]

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(path, **kw)

    def post(self, path: str, data: dict[str, Any] | None = None,
             follow_redirects: bool = True) -> Any:
        return self.client.post(path, data={**(data or {}), "csrf_token": self.token},
                                follow_redirects=follow_redirects)


def start_worker(spawn: Callable[..., Proc], values: dict[str, str]) -> Proc:
    """A real `senddock worker` process, returned once its pool is running."""
    proc = spawn(["worker"], values)
    wait_for(lambda: "running" in proc.output() or proc.popen.poll() is not None,
             timeout=30, message="worker start")
    assert proc.popen.poll() is None, proc.output()
    return proc


def in_flight(engine: sa.Engine) -> int:
    """Jobs claimed and not yet finished (`sending`), across all workers."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE status = 'sending'")).scalar_one())


def check_final(engine: sa.Engine, sink: Any, campaign: dict[str, Any],
                emails: list[str]) -> Counter[str]:
    """Everyone received at least once; counts equal the sink's record; returns the
    per-recipient delivery counts."""
    records = sink.records()
    received = Counter(r["rcpt_tos"][0] for r in records)
    assert set(received) == set(emails), "lost recipients: " + str(
        sorted(set(emails) - set(received))[:10])
    # A duplicate carries the same Message-ID as the first copy (P3).
    ids_by_rcpt: dict[str, set[str]] = {}
    for r in records:
        ids_by_rcpt.setdefault(r["rcpt_tos"][0], set()).add(r["message_id"])
    assert all(len(ids) == 1 for ids in ids_by_rcpt.values())
    with engine.connect() as conn:
        counts = queue.broadcast_counts(conn, campaign["broadcast_id"])
        assert counts == queue.broadcast_counts_slow(conn, campaign["broadcast_id"])
    assert counts["sent"] == len(received) == len(emails)
    assert sum(counts.values()) == len(emails)
    return received


def accepted_campaign(engine: sa.Engine, emails: list[str], *,
                      domain: str = "example.com") -> tuple[dict[str, Any],
                                                            dict[str, dict[str, Any]]]:
    """A campaign whose jobs the relay accepted: enqueued and marked ``sent`` with their
    Message-IDs (what a report after acceptance is about). Returns the campaign and its
    jobs by address."""
    campaign = make_campaign(engine, emails)
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        place_jobs(conn, sa.text(f"""
            UPDATE delivery_jobs SET status = 'sent', finished_at = now(),
                   message_id = '<' || id || '.' || correlation_id || '@{domain}>'
             WHERE broadcast_id = :b"""), {"b": campaign["broadcast_id"]})
        rows = conn.execute(sa.text("SELECT * FROM delivery_jobs WHERE broadcast_id = :b"),
                            {"b": campaign["broadcast_id"]}).mappings()
        return campaign, {r["email"]: dict(r) for r in rows}


def waiting_on_a_lock(engine: sa.Engine) -> bool:
    """Whether some session of the engine's database is waiting on a lock (a statement
    that a test's open transaction holds up)."""
    with engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()")).scalar_one())
