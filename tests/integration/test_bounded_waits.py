"""Every database wait of the engine is bounded: a claim that cannot
get its locks ends with the statement timeout instead of waiting for good, and a worker
whose liveness session was lost ends the zombie backend it left on the server when it
reconnects (and no peer's)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from workers import queue
from workers.core import pg
from workers.core.settings import Config
from workers.delivery import pool as pool_module
from workers.delivery.pool import Pool

QUERY_CANCELED = "57014"


@pytest.fixture()
def pools(engine: sa.Engine, config_for: Callable[..., Config],
          sink: Any) -> Iterator[Callable[[], Pool]]:
    made: list[Pool] = []

    def make() -> Pool:
        pool = Pool(engine, config_for(sink.port), node=f"waits-{len(made)}")
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.heartbeat.close()


def _alive(engine: sa.Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                         "WHERE pid = :pid"), {"pid": pid}).scalar())


def test_a_claim_waiting_for_a_lock_ends_with_the_statement_timeout(
        engine: sa.Engine, pools: Callable[[], Pool],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs table locked by another session: the claim gives up after CLAIM_TIMEOUT
    (query_canceled, a database error the drain loop backs off from), it does not wait
    for the lock to be released."""
    monkeypatch.setattr(pool_module, "CLAIM_TIMEOUT", 0.3)
    pool = pools()
    outcome: dict[str, Any] = {}

    def claim() -> None:
        try:
            outcome["jobs"] = pool._claim(pool._db, "00000000-0000-0000-0000-000000000001")
        except (sa.exc.OperationalError, psycopg.OperationalError) as exc:
            outcome["error"] = getattr(exc, "orig", exc)

    with engine.connect() as locker:
        locker.execute(sa.text("LOCK TABLE delivery_jobs IN ACCESS EXCLUSIVE MODE"))
        thread = threading.Thread(target=claim)
        thread.start()
        thread.join(30)  # the claim's own timeout ends it long before
        claimed_under_the_lock = not thread.is_alive()
        locker.rollback()
    thread.join()
    assert claimed_under_the_lock, "the claim waited for the lock"
    assert "error" in outcome, outcome
    assert getattr(outcome["error"], "sqlstate", None) == QUERY_CANCELED
    # The session's timeout was restored before it went back to the pool.
    with pool._db.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "0"


def test_a_claim_leaves_its_session_timeout_as_it_found_it(
        engine: sa.Engine, pools: Callable[[], Pool]) -> None:
    """The claim sets its timeout, claims and resets it in one round trip: the session
    goes back to the pool with the server's default, after a claim that found nothing
    and after one that failed."""
    pool = pools()
    with pool._db.session() as session:
        assert queue.claim_bounded(session, 0.3, "w", 10, "example.com",
                                   "00000000-0000-0000-0000-000000000002") == []
        assert session.execute("SHOW statement_timeout").fetchone() == ("0",)
        with pytest.raises(psycopg.errors.UndefinedFunction):
            with pg.setting_around(session, "statement_timeout", "300"):  # as a claim
                session.execute("SELECT no_such_function()")
        assert session.execute("SHOW statement_timeout").fetchone() == ("0",)


def test_a_driver_session_goes_back_out_of_autocommit(engine: sa.Engine,
                                                      pools: Callable[[], Pool]) -> None:
    """The claim's driver session is in autocommit only while the claim has it: a
    transaction on the pool's next checkout is a transaction, whatever ended the claim."""
    pool = pools()
    with pytest.raises(ValueError):
        with pool._db.session() as session:
            assert session.autocommit
            raise ValueError("the caller failed")
    with pool._db.session() as session:
        pass
    for _ in range(pool.engine.pool.size() + 1):
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection) and not driver.autocommit


def test_a_reconnecting_worker_ends_its_own_zombie_session_and_no_other(
        engine: sa.Engine, pools: Callable[[], Pool], caplog: pytest.LogCaptureFixture) -> None:
    """The liveness session is cut without the server knowing (a partition): the server
    keeps the backend until its own keepalives give up. The worker's next renewal opens a
    fresh session and terminates the stale one, named after this worker; a peer's
    liveness session, on the same server with the same role, is left alone."""
    worker, peer = pools(), pools()
    worker.heartbeat.start()
    peer.heartbeat.start()
    name = worker.heartbeat.session_name
    assert worker.worker_id in name and name != peer.heartbeat.session_name
    stale = worker.heartbeat._session()
    stale_pid = stale.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    peer_pid = peer.heartbeat._session().execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT application_name FROM pg_stat_activity "
                                    "WHERE pid = :p"), {"p": stale_pid}).scalar() == name
    # The worker loses the session; the server does not notice (no FIN reaches it).
    worker.heartbeat._conn = None
    caplog.set_level("INFO", logger="senddock.worker")
    worker.heartbeat.run()
    fresh_pid = worker.heartbeat._session().execute(
        sa.text("SELECT pg_backend_pid()")).scalar_one()
    assert fresh_pid != stale_pid
    assert not _alive(engine, stale_pid), "the zombie session is still on the server"
    assert _alive(engine, peer_pid), "a peer's liveness session was ended"
    assert _alive(engine, fresh_pid)
    assert worker.lease.current() is not None
    assert any("stale session" in r.getMessage() for r in caplog.records), caplog.text
    stale.invalidate()
