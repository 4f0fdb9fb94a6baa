"""A ``POST /messages`` is one statement to PostgreSQL in the steady state (docs/design.md
§13 and §23): the token check is remembered for a second, the
wake is sent by the process's waker, and a token the process itself revokes is refused
at once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from sqlalchemy import event

from tests.conftest import Api
from webapp import db
from webapp.domain import intake, kinds, users
from workers.core import pg
from workers.queue.enqueue_messages import ENQUEUE
from workers.queue.wakes import WAKE, WAKER


def _message(n: int) -> dict[str, Any]:
    return {"kind": "verification", "user_id": f"rt-{n}", "email": f"rt-{n}@example.org",
            "data": {"verify_url": "https://app.example/v"}}


@pytest.fixture()
def statements(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the process sends: through SQLAlchemy and straight to the driver."""
    seen: list[str] = []
    rows, tuples = pg.driver_rows, pg.driver_tuples

    def counted(conn: sa.Connection, statement: str, params: dict[str, Any]) -> Any:
        seen.append(statement)
        return rows(conn, statement, params)

    def counted_tuples(conn: sa.Connection, statement: pg.NativeStatement,
                       params: dict[str, Any], **options: Any) -> Any:
        seen.append(statement.source)
        return tuples(conn, statement, params, **options)

    def executed(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    monkeypatch.setattr(pg, "driver_rows", counted)
    monkeypatch.setattr(pg, "driver_tuples", counted_tuples)
    event.listen(engine, "before_cursor_execute", executed)
    yield seen
    event.remove(engine, "before_cursor_execute", executed)


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The token memory's clock, moved by hand."""
    now = [1000.0]
    monkeypatch.setattr(users.time, "monotonic", lambda: now[0])
    users.forget_tokens()
    return now


def test_a_message_request_is_one_statement(api: Api, statements: list[str],
                                            clock: list[float]) -> None:
    assert api.post("/messages", _message(0)).status_code == 202  # the token is checked
    assert WAKER.idle()
    statements.clear()
    sent_before = WAKER.sent
    for n in range(1, 21):
        assert api.post("/messages", _message(n)).status_code == 202
    assert WAKER.idle()
    wakes = [s for s in statements if s == WAKE]
    assert len(statements) - len(wakes) == 20, statements
    assert 1 <= len(wakes) == WAKER.sent - sent_before <= 20


def test_the_enqueue_statement_is_planned_once_per_session(engine: sa.Engine,
                                                          config_for: Any) -> None:
    """Prepared at its first run and never planned again on that session (left to
    PostgreSQL, it was planned anew on most calls: planning cost twice its execution)."""
    config = config_for()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        spec = kinds.active(conn, "verification")
        for n in range(8):
            [answer] = intake.submit(conn, config, [intake.Ask(
                spec, f"plan-{n}", f"plan-{n}@example.org",
                {"verify_url": "https://app.example/v"})], actor="tests")
            assert answer.error is None and answer.why == ""
        plans = conn.execute(sa.text(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'WITH item AS%'")).mappings().all()
        assert [dict(p) for p in plans] == [{"generic_plans": 8, "custom_plans": 0}]
        assert conn.execute(sa.text("SHOW plan_cache_mode")).scalar_one() == "auto"


def test_a_token_is_checked_again_after_a_second(api: Api, engine: sa.Engine,
                                                clock: list[float]) -> None:
    assert api.get("/lists").status_code == 200
    with engine.begin() as conn:  # as another process would revoke it
        conn.execute(sa.text("UPDATE api_tokens SET revoked_at = now()"))
    assert api.get("/lists").status_code == 200  # remembered
    clock[0] += users.TOKEN_MEMORY_SECONDS
    assert api.get("/lists").status_code == 401
    assert api.get("/lists").status_code == 401  # a refused token is never remembered


def test_a_token_revoked_here_is_refused_at_once(api: Api, engine: sa.Engine,
                                                 clock: list[float]) -> None:
    assert api.get("/lists").status_code == 200
    with engine.begin() as conn:
        token_id = conn.execute(sa.text("SELECT id FROM api_tokens")).scalar_one()
        users.revoke_token(conn, token_id, actor="tests")
        # A request between the revocation and its commit remembers the live token...
        assert api.get("/lists").status_code == 200
    # ...and the commit forgets it again.
    assert api.get("/lists").status_code == 401


def test_a_disabled_user_or_a_new_role_is_seen_at_once(
        client: Any, engine: sa.Engine, make_user: Any, clock: list[float]) -> None:
    marketer = make_user("marketer")
    admin = make_user("admin")
    as_marketer = Api(client, marketer["token"])
    assert as_marketer.get("/lists").status_code == 200
    with engine.begin() as conn:
        users.update_role(conn, marketer["id"], "support", actor=admin["email"])
    assert as_marketer.get("/lists").status_code == 403
    with engine.begin() as conn:
        users.set_active(conn, marketer["id"], False, actor=admin["email"])
    assert as_marketer.get("/lists").status_code == 401


def test_a_token_is_remembered_no_longer_than_it_lives(
        api: Api, engine: sa.Engine, client: Any, make_user: Any) -> None:
    user = make_user("admin")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE api_tokens SET expires_at = now() + interval '0.2 s' "
                             "WHERE user_id = :u"), {"u": user["id"]})
    users.forget_tokens()
    assert Api(client, user["token"]).get("/lists").status_code == 200
    (until, _), = [v for k, v in users._remembered.items()
                   if k[0] == users._token_hash(user["token"])]
    assert until - time.monotonic() <= 0.2


def _jit_in_plan(conn: Any) -> bool:
    """Whether PostgreSQL would JIT-compile a 500-ask enqueue statement on this session."""
    items = json.dumps([{"i": i, "k": 0, "email": f"j{i}@example.org", "user_ref": f"j{i}",
                         "payload": {}} for i in range(500)])
    kinds_ = json.dumps([{"k": 0, "name": "verification", "priority": 10,
                          "dedupe_window": 0, "one_live": True, "cooldown": 60}])
    with conn.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {ENQUEUE}", {
            "items": items, "kinds": kinds_, "actor": "tests", "max_backlog": None,
            "notify": False})
        [[plan]] = cur.fetchall()
    return "JIT" in plan[0]


def test_no_session_of_ours_compiles_a_statement_with_jit(db_url: str, pg_server: str) -> None:
    """PostgreSQL JIT-compiles a statement whose estimated cost passes ``jit_above_cost``,
    and the estimate grows with the tables: at about 120,000 jobs every enqueue compiled
    some 245 functions for 150-240 ms, to execute in 2 (docs/performance.md). Our sessions
    run without JIT, even on a database that would compile everything."""
    name = sa.make_url(db_url).database
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET jit_above_cost = 0')  # type: ignore[arg-type]
        available = admin.execute("SELECT pg_jit_available()").fetchone()
    with psycopg.connect(db_url) as bare:
        # Where the server has JIT at all, a session left to the database's settings uses it.
        assert _jit_in_plan(bare) == bool(available and available[0])
    engine = db.make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            assert not _jit_in_plan(conn.connection.driver_connection)
            assert conn.execute(sa.text("SHOW jit")).scalar_one() == "off"
    finally:
        engine.dispose()
    # The URL's own options are kept beside ours.
    url_options = make_conninfo(pg.conninfo(db_url), options="-c work_mem=7MB")
    with pg.connect(url_options, application_name="tests") as raw:
        assert not _jit_in_plan(raw)
        assert raw.execute("SHOW work_mem").fetchone() == ("7MB",)
