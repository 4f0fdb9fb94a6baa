"""Sequences across a database failover (docs/sequences.md, "What exactly once means
here"), on private PostgreSQL clusters (harness/pgcluster.py): a real ``senddock worker``
advances a two-email drip while the primary is stopped ``-m immediate`` and the
synchronous standby promoted; the advancer follows the multi-host URL, every step of every
enrollment becomes exactly one job, and every message reaches the sink."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from harness.pgcluster import Clusters
from tests.conftest import Proc, settings, wait_for
from tests.integration.test_pg_production import ClusterApp, cluster_app  # noqa: F401
from webapp.domain import lists
from webapp.domain import sequences as domain

pytestmark = pytest.mark.slow

PEOPLE = 600


def _count(engine: sa.Engine, sql: str) -> int:
    """The count, or -1 while the test's own connection meets the switch."""
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar_one())
    except sa.exc.OperationalError:
        return -1


def test_the_advancer_survives_a_primary_switch_without_a_duplicate_job(
        pg_clusters: Clusters, sink: Any, spawn: Callable[..., Proc],
        cluster_app: Callable[..., ClusterApp]) -> None:  # noqa: F811
    primary = pg_clusters.primary()
    standby = pg_clusters.standby(primary, synchronous=True)
    url = (f"postgresql://senddock@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/"
           f"senddock?target_session_attrs=read-write")
    site = cluster_app(url)
    with site.engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Drip")["id"])
        domain.create_sequence(conn, {
            "name": "Drip", "trigger_type": "list_add", "list_id": list_id, "steps": [
                {"type": "email", "subject": "One", "text_body": "1"},
                {"type": "wait", "wait_seconds": 2},
                {"type": "email", "subject": "Two", "text_body": "2"}]}, "tests")
    worker = spawn(["worker"], settings(url, sink.port, WORKER_TIMEOUT="5",
                                        HEARTBEAT_INTERVAL="1"))
    emails = [f"d{i}@example.org" for i in range(PEOPLE)]
    # People join in slices while the worker runs, so steps are due on both sides of the
    # switch.
    for start in range(0, PEOPLE, 100):
        with site.engine.begin() as conn:
            lists.add_subscribers(conn, list_id, [{"email": e} for e in
                                                  emails[start:start + 100]])
    wait_for(lambda: _count(site.engine, "SELECT count(*) FROM delivery_jobs "
                                         "WHERE kind = 'sequence'") >= PEOPLE // 2,
             timeout=120, message="the drip under way")
    before = _count(site.engine, "SELECT count(*) FROM delivery_jobs WHERE kind = 'sequence'")
    primary.stop("immediate")
    standby.promote()
    site.engine.dispose()  # the test's own connections to the stopped primary
    wait_for(lambda: _count(site.engine, "SELECT count(*) FROM sequence_enrollments "
                                         "WHERE status = 'done'") == PEOPLE,
             timeout=240, interval=0.5, message="every enrollment done on the new primary")
    wait_for(lambda: len({(r["rcpt_tos"][0], r["subject"]) for r in sink.records()})
             == 2 * PEOPLE, timeout=240, interval=0.5, message="every message delivered")
    assert worker.terminate() == 0
    with site.engine.connect() as conn:
        keys = Counter(r[0] for r in conn.execute(sa.text(
            "SELECT idempotency_key FROM delivery_jobs WHERE kind = 'sequence'")))
        visits = conn.execute(sa.text(
            "SELECT count(*), count(DISTINCT (enrollment_id, step_id)), "
            "count(job_id) FROM sequence_visits WHERE outcome = 'sent'")).one()
    assert len(keys) == 2 * PEOPLE and set(keys.values()) == {1}
    assert tuple(visits) == (2 * PEOPLE, 2 * PEOPLE, 2 * PEOPLE)
    received = Counter((r["rcpt_tos"][0], r["subject"]) for r in sink.records())
    assert set(received) == {(e, s) for e in emails for s in ("One", "Two")}
    print(f"\nsequence jobs before the switch {before} of {2 * PEOPLE}; messages "
          f"delivered twice (the honest window) {sum(n - 1 for n in received.values())}")
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
