"""Alembic environment: the URL comes from SendDock (``webapp.db.alembic_config``)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from webapp.models import metadata

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    connectable = config.attributes.get("connection")
    if connectable is not None:
        context.configure(connection=connectable, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    from webapp.db import make_engine

    engine = make_engine(url, pool_size=1, process="migrate", role="migrations",
                         idle_timeout=None)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            # Several processes may start at once: one migrates, the others wait.
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(7361001)"))
            context.run_migrations()
    engine.dispose()


run_migrations_online()
