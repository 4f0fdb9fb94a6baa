"""The statement triggers that join a statement's new rows to its old ones stay linear in a
long-lived session (migration 0034_trigger_plans).

PL/pgSQL plans a trigger's statement on the session's first call and keeps the plan. A
worker's first update is a finish of a few jobs; if that plan is a nested loop, a later
update of N jobs in the same session compares N x N rows (a 10,000-job settle chunk took
34-38 s on the 10M table). Here: a few one-job updates first, then one update of 40,000
jobs in the same session under a statement timeout that a linear plan meets many times over
and the nested loop (1.6e9 comparisons, minutes on any machine) cannot.
"""

from __future__ import annotations

import sqlalchemy as sa

from workers.core.states import CANCELLED, PENDING

ROWS = 40_000


def test_a_big_update_after_small_ones_in_one_session_stays_linear(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO delivery_jobs (kind, priority, status, email) "
            "SELECT 'plans', 5, :pending, 'u' || g || '@example.com' "
            "FROM generate_series(1, :n) g"), {"pending": PENDING, "n": ROWS})
        ids = [r.id for r in conn.execute(sa.text(
            "SELECT id FROM delivery_jobs WHERE kind = 'plans' ORDER BY id LIMIT 6"))]
    with engine.connect() as conn:  # one session throughout
        for job_id in ids:  # the first calls plan the triggers on one-row tables
            conn.execute(sa.text("UPDATE delivery_jobs SET status = :to, finished_at = now() "
                                 "WHERE id = :id"), {"to": CANCELLED, "id": job_id})
            conn.commit()
        conn.execute(sa.text("SET statement_timeout = '60s'"))
        moved = conn.execute(sa.text(
            "UPDATE delivery_jobs SET status = :to, finished_at = now() "
            "WHERE kind = 'plans' AND status = :pending"),
            {"to": CANCELLED, "pending": PENDING}).rowcount
        conn.commit()
    assert moved == ROWS - len(ids)
    with engine.connect() as conn:
        counted = conn.execute(sa.text(
            "SELECT coalesce(sum(n), 0) FROM job_outcome_counts "
            "WHERE kind = 'plans' AND outcome = :c"), {"c": CANCELLED}).scalar_one()
    assert counted == ROWS  # the outcome trigger counted every move exactly once


def test_the_joining_triggers_are_planned_without_nested_loops(engine: sa.Engine) -> None:
    from importlib import import_module

    migration = import_module("migrations.versions.0034_trigger_plans")
    with engine.connect() as conn:
        configs = dict(conn.execute(sa.text(
            "SELECT proname, proconfig FROM pg_proc WHERE proname = ANY(:names)"),
            {"names": list(migration.JOINING_TRIGGERS)}).all())
        joining = {r.proname for r in conn.execute(sa.text(
            "SELECT proname FROM pg_proc WHERE proname LIKE 'senddock%' "
            "AND prosrc ~ 'new_rows n\\s+JOIN old_rows'"))}
    assert joining == set(migration.JOINING_TRIGGERS)  # a new joining trigger is listed too
    assert all("enable_nestloop=off" in (configs[name] or []) for name in joining)
