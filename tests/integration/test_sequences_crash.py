"""Sequences under SIGKILL: real `senddock worker` processes killed between and
during steps, a real SMTP sink and PostgreSQL. Each (enrollment, step) gets exactly one
job; every step reaches the sink; a second copy only for a message in flight at a kill
(the engine's honest window, P3)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Proc, settings, wait_for
from tests.helpers import in_flight, start_worker
from webapp.domain import lists
from webapp.domain import sequences as domain

pytestmark = pytest.mark.slow

STEPS = [
    {"type": "email", "subject": "Step 1 for {{ email }}", "text_body": "one"},
    {"type": "wait", "wait_seconds": 1},
    {"type": "email", "subject": "Step 2 for {{ email }}", "text_body": "two"},
    {"type": "wait", "wait_seconds": 1},
    {"type": "email", "subject": "Step 3 for {{ email }}", "text_body": "three"},
]


def _progress(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) "
            "FROM sequence_enrollments")).one()
    return int(row[0]), int(row[1])


def _unsent(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE kind = 'sequence' AND status <> 'sent'"
        )).scalar_one())


def test_sigkill_storm_during_a_drip(engine: sa.Engine, db_url: str, sink: Any,
                                     spawn: Callable[..., Proc]) -> None:
    n = 400
    emails = [f"drip{i}@example.org" for i in range(n)]
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Drip")["id"])
        domain.create_sequence(conn, {"name": "Drip", "trigger_type": "list_add",
                                      "list_id": list_id, "steps": STEPS}, "tests")
        lists.add_subscribers(conn, list_id, [{"email": e} for e in emails])
    values = settings(db_url, sink.port)
    flying_at_kills = []
    kills = 0
    for _ in range(6):  # kill again and again while steps are being made and sent
        proc = start_worker(spawn, values)
        before = len(sink.records())
        wait_for(lambda b=before: len(sink.records()) >= b + 50  # type: ignore[misc]
                 or _progress(engine)[0] == n, timeout=60, message="some progress")
        if _progress(engine)[0] == n:
            proc.kill()
            break
        proc.freeze()
        time.sleep(0.2)
        flying_at_kills.append(in_flight(engine))
        proc.kill()
        kills += 1
    final = start_worker(spawn, values)
    wait_for(lambda: _progress(engine)[0] == n, timeout=120, message="every drip done")
    wait_for(lambda: _unsent(engine) == 0, timeout=120, message="every job sent")
    final.terminate()
    with engine.connect() as conn:
        jobs, pairs = conn.execute(sa.text(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM delivery_jobs "
            "WHERE kind = 'sequence'")).one()
        visits = conn.execute(sa.text(
            "SELECT count(*) FROM sequence_visits WHERE job_id IS NOT NULL")).scalar_one()
    assert jobs == pairs == visits == 3 * n
    received = Counter((r["rcpt_tos"][0], r["subject"].split(" for ")[0])
                       for r in sink.records())
    expected = {(e, f"Step {k}") for e in emails for k in (1, 2, 3)}
    assert set(received) == expected, sorted(expected - set(received))[:5]
    duplicates = sum(c - 1 for c in received.values())
    print(f"\n{kills} SIGKILLs during a drip of {n} x 3 steps; in flight at the kills: "
          f"{flying_at_kills}; jobs {jobs} for {pairs} (enrollment, step) pairs; "
          f"duplicates at the sink: {duplicates}")
    assert kills >= 2
    assert duplicates <= sum(flying_at_kills)
