"""The migrations produce exactly the models' schema."""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from webapp.models import metadata


def test_migrations_match_models(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn)
        diff = compare_metadata(context, metadata)
    assert diff == [], f"migrations and models differ: {diff}"


def test_count_triggers_installed(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        names = set(conn.execute(sa.text(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'delivery_jobs'::regclass "
            "AND NOT tgisinternal")).scalars())
    assert names == {"delivery_jobs_count_insert", "delivery_jobs_count_update",
                     "delivery_jobs_count_delete"}


def test_state_and_kind_checks_are_the_engine_vocabulary(engine: sa.Engine) -> None:
    """The CHECK constraints in the database list exactly workers.states' names."""
    from workers import states

    with engine.connect() as conn:
        defs = dict(conn.execute(sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'delivery_jobs'::regclass AND contype = 'c'")).all())

    def names(constraint: str) -> set[str]:
        return set(re.findall(r"'([a-z_]+)'::text", defs[constraint]))

    assert names("delivery_jobs_status_check") == set(states.STATES)
    assert names("delivery_jobs_kind_check") == set(states.KINDS)
