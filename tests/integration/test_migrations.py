"""The migrations produce exactly the models' schema."""

from __future__ import annotations

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
