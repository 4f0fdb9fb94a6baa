"""The delivery engine's database sessions: autocommit, held for one statement or one short
transaction, each statement bounded by a timeout (docs/design.md §15)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import Connection, Engine

from workers.delivery import services

DB_ERRORS = services.DB_ERRORS


class StatementDb:
    """The delivery engine's connections in autocommit, held for one statement (a claim,
    an outcome with its aftermath) or by the finisher while outcomes keep coming, never
    across SMTP, so the drain threads share DB_DELIVERY_POOL connections. A statement is
    its own transaction: committed when it returns. A connection that failed is
    invalidated, never handed out again."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def connect(self, statement_timeout: float | None = None) -> Iterator[Connection]:
        """A connection, with ``statement_timeout`` seconds on each statement if given
        (the session's setting is restored before it goes back to the pool)."""
        with self.engine.connect() as conn:
            try:
                # On the driver's session itself: through SQLAlchemy, the two settings cost
                # a third of a claim's interpreter time.
                driver = conn.connection.driver_connection
                assert isinstance(driver, psycopg.Connection)
                if statement_timeout is not None:
                    driver.execute(_SET_TIMEOUT % int(statement_timeout * 1000))
                try:
                    yield conn
                finally:
                    if statement_timeout is not None and not conn.invalidated:
                        driver.execute(_RESET_TIMEOUT)
            except DB_ERRORS:
                # The driver may have raised past SQLAlchemy (a prepared statement):
                # make sure the pool drops this session.
                conn.invalidate()
                raise

    @contextmanager
    def session(self) -> Iterator[psycopg.Connection]:
        """The driver's session of a pooled connection, without SQLAlchemy's connection
        around it, for a statement run every few messages (the claim): checking a
        connection out and in through SQLAlchemy cost as much of the worker's interpreter
        time as running the claim. The session is in autocommit; whatever else the caller
        changes on it, it restores. A session that failed is dropped."""
        fairy = self.engine.raw_connection()
        driver = fairy.driver_connection
        assert isinstance(driver, psycopg.Connection)
        try:
            driver.autocommit = True  # as the engine's connections (no round trip)
            yield driver
        except DB_ERRORS:
            fairy.invalidate()
            raise
        finally:
            if fairy.is_valid:
                try:  # back as the pool hands its connections out
                    driver.autocommit = False
                except psycopg.Error:  # left in a transaction, or broken
                    fairy.invalidate()
            fairy.close()

    @contextmanager
    def transaction(self, statement_timeout: float | None = None) -> Iterator[Connection]:
        """Several statements committed together (BEGIN … COMMIT on one session)."""
        with self.connect(statement_timeout) as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            with driver.transaction():
                yield conn


_SET_TIMEOUT = "SET statement_timeout = %d"
_RESET_TIMEOUT = "RESET statement_timeout"
