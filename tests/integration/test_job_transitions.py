"""PostgreSQL itself refuses an illegal job move: the trigger of migration
0021_arch is workers/core/states.py TRANSITIONS, tried here for every pair of states."""

from __future__ import annotations

import importlib.util
from itertools import permutations

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import ROOT
from tests.helpers import make_campaign
from workers import queue
from workers.core import states

MIGRATION = ROOT / "migrations" / "versions" / "0022_arch_job_transitions.py"


def _job(conn: sa.Connection, status: str) -> int:
    return int(conn.execute(sa.text("""
        INSERT INTO delivery_jobs (kind, priority, status, email)
        VALUES ('test', 0, :status, 'moves@example.org') RETURNING id"""),
        {"status": status}).scalar_one())


def _moves(conn: sa.Connection, job_id: int, new: str) -> bool:
    """Whether the database lets the job move to ``new`` (rolled back either way)."""
    savepoint = conn.begin_nested()
    try:
        conn.execute(sa.text("UPDATE delivery_jobs SET status = :s WHERE id = :id"),
                     {"s": new, "id": job_id})
    except sa.exc.IntegrityError as exc:
        savepoint.rollback()
        assert isinstance(exc.orig, psycopg.Error) and exc.orig.sqlstate == "23514", exc
        return False
    savepoint.rollback()
    return True


def test_every_pair_of_states_moves_exactly_as_transitions_says(engine: sa.Engine) -> None:
    allowed: dict[tuple[str, str], bool] = {}
    with engine.connect() as conn, conn.begin() as tx:
        jobs = {status: _job(conn, status) for status in states.STATES}
        for old, new in permutations(states.STATES, 2):
            allowed[(old, new)] = _moves(conn, jobs[old], new)
        tx.rollback()
    wrong = {pair: ok for pair, ok in allowed.items() if ok != states.can_move(*pair)}
    assert wrong == {}
    assert sum(allowed.values()) == sum(len(t) for t in states.TRANSITIONS.values())


def test_an_illegal_move_is_refused_and_names_it(engine: sa.Engine) -> None:
    campaign = make_campaign(engine, ["a@example.org", "b@example.org"])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        # The legal road to `sent`: claimed, then finished.
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'sending' "
                             "WHERE email = 'a@example.org'"))
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now() "
                             "WHERE email = 'a@example.org'"))
    with pytest.raises(sa.exc.IntegrityError) as refused, engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'pending' "
                             "WHERE status = 'sent'"))
    assert "sent -> pending is not a legal move" in str(refused.value)
    with engine.begin() as conn:
        # The statement was refused whole; a status left as it is is no move at all.
        rows = dict(conn.execute(sa.text(
            "SELECT email, status FROM delivery_jobs WHERE campaign_id = :c"),
            {"c": campaign["id"]}).all())
        assert rows == {"a@example.org": "sent", "b@example.org": "pending"}
        conn.execute(sa.text("UPDATE delivery_jobs SET status = status, last_error = 'x' "
                             "WHERE campaign_id = :c"), {"c": campaign["id"]})


def test_the_migration_freezes_the_current_transitions() -> None:
    """A change to TRANSITIONS needs a migration that replaces the trigger."""
    spec = importlib.util.spec_from_file_location("migration_0021", MIGRATION)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    frozen = {old: frozenset(new) for old, new in migration.MOVES.items()}
    assert frozen == states.TRANSITIONS
