"""A hot statement (``workers.core.pg.driver_tuples``: the enqueue) is one round trip with
its generic plan forced around it, in autocommit (written to libpq directly) and inside a
transaction, begun or not yet (psycopg's pipeline); a failure leaves the session's
settings as they were and the session usable, and a session lost on the way is never
given back to the pool."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from workers.core import pg

INSERT = pg.NativeStatement("INSERT INTO hot_rows (x) SELECT CAST(%(x)s AS int) / "
                            "CAST(%(y)s AS int) RETURNING x, 'made' AS what")


@pytest.fixture()
def hot(engine: sa.Engine) -> Iterator[sa.Engine]:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE hot_rows (x int)"))
    yield engine
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE hot_rows"))


def _rows(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT x FROM hot_rows ORDER BY x")).scalars())


def _plans(conn: sa.Connection) -> list[tuple[int, int]]:
    return [tuple(r) for r in conn.execute(sa.text(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
        "WHERE statement = :text ORDER BY prepare_time"), {"text": INSERT.text})]


def _session_as_found(conn: sa.Connection) -> None:
    raw = conn.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    assert raw.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    assert conn.execute(sa.text("SHOW plan_cache_mode")).scalar_one() == "auto"


def test_in_autocommit_it_commits_with_one_generic_plan(hot: sa.Engine) -> None:
    with hot.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for x in range(1, 8):
            assert pg.driver_tuples(conn, INSERT, {"x": x, "y": 1}) == (
                ["x", "what"], [(x, "made")])
        assert _plans(conn) == [(7, 0)]
        # The setting and its reset are prepared once too.
        assert conn.execute(sa.text(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE "
            "'%plan_cache_mode%'")).scalar_one() == 2
        _session_as_found(conn)
    assert _rows(hot) == [1, 2, 3, 4, 5, 6, 7]


def test_parameters_of_other_types_get_a_statement_of_their_own(engine: sa.Engine) -> None:
    """psycopg gives an integer the type its size needs (and NULL none): a statement
    prepared for one set of types is never run with another's."""
    bigger = pg.NativeStatement("SELECT CAST(%(n)s AS bigint) + 1 AS n")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        answers = [pg.driver_tuples(conn, bigger, {"n": n})[1]
                   for n in (1, 2**40, None, 70_000, 2)]
        assert answers == [[(2,)], [(2**40 + 1,)], [(None,)], [(70_001,)], [(3,)]]
        assert conn.execute(sa.text(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = :text"),
            {"text": bigger.text}).scalar_one() >= 3


@pytest.mark.parametrize("begun", [True, False], ids=["begun", "not-yet-begun"])
def test_in_a_transaction_it_is_the_transactions(hot: sa.Engine, begun: bool) -> None:
    with hot.connect() as conn:
        with conn.begin():
            if begun:  # psycopg has sent BEGIN already
                conn.execute(sa.text("SELECT 1"))
            assert pg.driver_tuples(conn, INSERT, {"x": 5, "y": 1})[1] == [(5, "made")]
            assert _rows(hot) == []  # not committed yet
            assert conn.execute(sa.text("SELECT count(*) FROM hot_rows")).scalar_one() == 1
            _session_as_found(conn)
            conn.rollback()
    assert _rows(hot) == []


def test_a_failure_leaves_the_session_as_it_found_it(hot: sa.Engine) -> None:
    with hot.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        with pytest.raises(sa.exc.DataError) as raised:  # as SQLAlchemy raises it
            pg.driver_tuples(conn, INSERT, {"x": 1, "y": 0})
        assert isinstance(raised.value.orig, psycopg.errors.DivisionByZero)
        assert not conn.invalidated
        _session_as_found(conn)
        # Prepared by the call that failed, and used as it is from then on.
        assert pg.driver_tuples(conn, INSERT, {"x": 2, "y": 1})[1] == [(2, "made")]
        assert _plans(conn) == [(2, 0)]
    assert _rows(hot) == [2]


def test_a_session_lost_on_the_way_is_dropped(hot: sa.Engine) -> None:
    with hot.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        pg.driver_tuples(conn, INSERT, {"x": 1, "y": 1})
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with hot.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(sa.exc.OperationalError) as raised:
            pg.driver_tuples(conn, INSERT, {"x": 2, "y": 1})
        assert raised.value.connection_invalidated
    with hot.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert pg.driver_tuples(conn, INSERT, {"x": 3, "y": 1})[1] == [(3, "made")]
    assert _rows(hot) == [1, 3]


def test_statements_psycopg_deallocated_are_prepared_again(hot: sa.Engine) -> None:
    """psycopg sends DEALLOCATE ALL when it rolls back a transaction while statements of
    its own are prepared (a page's connection going back to the pool does): the next call
    prepares the statement, the setting and the reset again, and runs once."""
    with hot.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert pg.driver_tuples(conn, INSERT, {"x": 1, "y": 1})[1] == [(1, "made")]
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        raw.execute("SELECT 1", prepare=True)  # one of psycopg's own
        raw.autocommit = False
        raw.execute("SELECT 1")
        raw.rollback()
        raw.autocommit = True
        assert raw.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
        assert pg.driver_tuples(conn, INSERT, {"x": 2, "y": 1})[1] == [(2, "made")]
        assert _plans(conn) == [(1, 0)]
        _session_as_found(conn)
    assert _rows(hot) == [1, 2]
