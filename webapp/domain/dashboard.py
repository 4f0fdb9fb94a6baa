"""What each role's dashboard shows first: an admin the queue's state, the
last hour's failures and the relay; support the verification mail that failed or is held;
a marketer the campaigns. Every number comes from counters or an index (no full count)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from webapp.domain import campaigns, queue_reads
from workers import queue
from workers.core.settings import Config
from workers.core.states import PENDING, RETRY, SENDING
from workers.queue import ProblemFilter

FAILURE_WINDOW = timedelta(hours=1)


def for_admin(conn: Connection, config: Config) -> dict[str, Any]:
    since = datetime.now(UTC) - FAILURE_WINDOW
    by_kind = queue_reads.jobs_by_kind_and_state(conn)
    workers = queue_reads.running_workers(conn)
    return {
        "backlog": queue.backlog(conn),
        # Pending and due: a message asked for later (send_at ahead) is not waiting yet.
        "due": max(0, sum(by_state[PENDING] for by_state in by_kind.values())
                   - queue_reads.scheduled_message_count(conn, queue_reads.JobFilter())),
        "oldest_due": queue_reads.oldest_due_age(conn),
        "in_flight": sum(by_state[SENDING] for by_state in by_kind.values()),
        "retrying": sum(by_state[RETRY] for by_state in by_kind.values()),
        "failures_hour": queue_reads.problems_since(conn, since),
        "recent_failures": queue_reads.problem_jobs(conn, ProblemFilter(since=since),
                                                    limit=5),
        "failures_since": since,
        "relay": queue.relay_status(conn),
        "live_workers": sum(1 for w in workers if w["live"]),
        "campaigns": campaigns.all_with_counts(conn, limit=10),
    }


def for_support(conn: Connection) -> dict[str, Any]:
    return {
        "failures": queue_reads.problem_jobs(conn, ProblemFilter(kind="verification"),
                                             limit=10),
        "held": queue_reads.held_jobs(conn, "verification", limit=10),
        "held_count": queue_reads.held_count(conn, "verification"),
    }


def for_marketer(conn: Connection) -> dict[str, Any]:
    return {"campaigns": campaigns.all_with_counts(conn, limit=20)}
