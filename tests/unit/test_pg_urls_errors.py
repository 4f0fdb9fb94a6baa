"""workers.core.pg: every URL form libpq reads, one-line errors naming the variable, and the
one translation of database errors by SQLSTATE."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from workers.core import pg


@pytest.mark.parametrize("raw, hosts, ports", [
    ("postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write", "h1,h2",
     "5432,5433"),
    ("postgresql://u@/db?host=h1:5432&host=h2:5433", "h1,h2", "5432,5433"),
    ("postgresql://u@/db?host=h1,h2&port=5432,5433", "h1,h2", "5432,5433"),
    ("postgresql+psycopg://u@h1:5432/db", "h1", "5432"),
    ("postgres://u@h1/db", "h1", None),
    ("host=h1,h2 port=5432,5433 dbname=db", "h1,h2", "5432,5433"),
])
def test_every_libpq_url_form(raw: str, hosts: str, ports: str | None) -> None:
    params = conninfo_to_dict(pg.conninfo(raw))
    assert params["host"] == hosts
    assert params.get("port") == ports
    assert params["dbname"] == "db"


@pytest.mark.parametrize("raw", [
    "mysql://u@h/db", "postgresql://u@h:notaport/db", "not a url at all",
    "postgresql://u@/db?host=a,b,c&port=1,2",
])
def test_bad_url_is_one_line_naming_the_variable(raw: str) -> None:
    with pytest.raises(pg.DatabaseUrlError) as err:
        pg.conninfo(raw)
    message = str(err.value)
    assert message.startswith("SENDDOCK_DATABASE_URL ")
    assert "\n" not in message


def test_describe_hides_credentials() -> None:
    text = pg.describe(pg.conninfo("postgresql://u:secret@h1:5432,h2:5433/db"))
    assert text == "h1:5432,h2:5433/db"


def _error(cls: type[psycopg.Error], message: str = "x") -> sa.exc.DBAPIError:
    return sa.exc.OperationalError("SELECT 1", {}, cls(message))


@pytest.mark.parametrize("cls, kind", [
    (psycopg.errors.DiskFull, "disk_full"),
    (psycopg.errors.TooManyConnections, "too_many_connections"),
    (psycopg.errors.ReadOnlySqlTransaction, "read_only"),
    (psycopg.errors.AdminShutdown, "shutdown"),
    (psycopg.errors.LockNotAvailable, "busy"),
    (psycopg.errors.QueryCanceled, "busy"),
])
def test_sqlstates(cls: type[psycopg.Error], kind: str) -> None:
    problem = pg.classify(_error(cls))
    assert problem is not None and problem.kind == kind


@pytest.mark.parametrize("message, kind", [
    ('connection failed: connection to server at "127.0.0.1", port 5999 failed: FATAL:  '
     "sorry, too many clients already", "too_many_connections"),
    ("connection failed: FATAL:  remaining connection slots are reserved for non-"
     "replication superuser connections", "too_many_connections"),
    ("connection failed: FATAL:  the database system is starting up", "shutdown"),
    ('connection failed: connection to server at "127.0.0.1", port 5999 failed: '
     "Connection refused", "unreachable"),
    ("connection failed: server is in hot standby mode", "read_only"),
])
def test_connect_failures_by_server_message(message: str, kind: str) -> None:
    problem = pg.classify(_error(psycopg.OperationalError, message))
    assert problem is not None and problem.kind == kind


def test_not_a_database_problem() -> None:
    assert pg.classify(ValueError("x")) is None
    bad_sql = sa.exc.ProgrammingError("SELEC", {}, psycopg.errors.SyntaxError("syntax"))
    assert pg.classify(bad_sql) is None
    assert pg.classify(sa.exc.TimeoutError("QueuePool limit")) is pg.BUSY


def test_each_problem_has_its_own_message() -> None:
    messages = {p.message for p in pg.PROBLEMS.values()}
    statuses = {p.status for p in pg.PROBLEMS.values()}
    assert len(messages) == len(statuses) == len(pg.PROBLEMS)


def test_budget_formula() -> None:
    budget = pg.Budget(web=3, delivery=4)
    # web, health, delivery (the send guard's session among them), liveness
    assert budget.total("serve") == 3 + 1 + 4 + 1
    assert budget.total("worker") == 4 + 1  # the LISTEN is on the liveness session
    assert budget.total("web") == 3 + 1
    from workers.core.settings import load

    defaults = pg.Budget(web=load().db_web_pool, delivery=load().db_delivery_pool)
    # A web connection per request thread (5): one serve plus one worker 11 + 5 = 16, so
    # they fit max_connections 20 (3 reserved) with a slot for a psql
    # (docs/configuration.md; tests/integration/test_connection_budget.py measures it).
    assert defaults.total("serve") + defaults.total("worker") <= 16


def test_outage_logs_start_change_and_end(caplog: pytest.LogCaptureFixture) -> None:
    outage = pg.Outage("worker", settle=0)
    caplog.set_level("INFO", logger="senddock.database")
    for _ in range(5):
        outage.failed(pg.UNREACHABLE)
    outage.failed(pg.TOO_MANY_CONNECTIONS)
    # Threads meeting the outage at different moments: its kinds in turn, no new lines.
    for _ in range(3):
        outage.failed(pg.UNREACHABLE)
        outage.failed(pg.TOO_MANY_CONNECTIONS)
    outage.ok()
    outage.ok()
    outage.failed(pg.UNREACHABLE)  # a new outage: said again
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert "database unreachable" in lines[0]
    assert "too many connections" in lines[1]
    assert "usable again after" in lines[2]
    assert "database unreachable" in lines[3]


def test_outage_stragglers_after_the_end_make_no_new_lines(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition heals: one thread's success ends the outage, then attempts that began
    during it (a connect_timeout, a tcp_user_timeout) fail in the next seconds. They are
    the same outage's tail, not a new one: no "unreachable" / "usable again" pair each.
    Failures that go on past the settle window are a new outage, said once."""
    now = [1000.0]
    monkeypatch.setattr(pg.time, "monotonic", lambda: now[0])
    outage = pg.Outage("worker", settle=10.0)
    caplog.set_level("INFO", logger="senddock.database")
    outage.failed(pg.UNREACHABLE)
    now[0] += 15
    outage.ok()
    for _ in range(3):  # stragglers, each followed by a success
        now[0] += 1
        outage.failed(pg.UNREACHABLE)
        outage.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "usable again after 15.0 s" in lines[1]
    now[0] += 1
    outage.failed(pg.UNREACHABLE)  # still failing after the window: a new outage
    now[0] += 10
    outage.failed(pg.UNREACHABLE)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "database unreachable" in lines[2], lines
    now[0] += 5
    outage.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and "usable again after 15.0 s" in lines[3], lines
