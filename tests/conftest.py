"""Real services for the tests: PostgreSQL (the machine's, else embedded), a template
database migrated once per session and copied per test, a real SMTP sink on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from harness.dns import shared_server as shared_dns_server
from webapp import create_app, db, pgserver
from workers.core.settings import Config, load

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.real.fixtures"]

# The quick run (README "Development": `pytest -m "not slow"`) leaves out what starts real
# processes: a browser test, and any test using a fixture that runs a server of its own.
SLOW_FIXTURES = frozenset({"spawn", "live_server", "page", "browser", "pg_clusters",
                           "relay", "postfix_proc", "dovecot", "dovecot_proc"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        e2e = item.nodeid.startswith("tests/e2e/")
        if e2e:
            item.add_marker(pytest.mark.e2e)
        if e2e or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _server_url() -> str:
    """A PostgreSQL server for the tests: SENDDOCK_TEST_DATABASE_URL, the local one on
    127.0.0.1:5432, or an embedded one started for this session."""
    explicit = os.environ.get("SENDDOCK_TEST_DATABASE_URL")
    if explicit:
        return explicit
    local = "postgresql://postgres@127.0.0.1:5432/postgres"
    if not os.environ.get("SENDDOCK_TEST_EMBEDDED"):
        try:
            psycopg.connect(local, connect_timeout=2).close()
            return local
        except psycopg.Error:
            pass
    data_dir = Path(os.environ.get("SENDDOCK_TEST_PGDATA",
                                   Path(tempfile.gettempdir()) / "senddock-test-pg"))
    return pgserver.start_embedded(data_dir)


def _with_db(url: str, name: str) -> str:
    return sa.make_url(db.normalize_url(url)).set(database=name).render_as_string(
        hide_password=False).replace("postgresql+psycopg://", "postgresql://")


def _admin(url: str, sql: str) -> None:
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_server() -> str:
    return _server_url()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    name = f"senddock_tpl_{os.getpid()}"
    _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}"')
    _admin(pg_server, f'CREATE DATABASE "{name}"')
    db.upgrade(_with_db(pg_server, name))
    yield name
    _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def db_url(pg_server: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test (a copy of the template)."""
    name = f"senddock_t_{uuid.uuid4().hex[:12]}"
    _admin(pg_server, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield _with_db(pg_server, name)
    _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = db.make_engine(db_url, pool_size=10)
    yield eng
    eng.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture()
def sink(tmp_path: Path) -> Iterator[Any]:
    """A real SMTP server on loopback that records what it accepts."""
    from webapp.sink import SinkServer

    server = SinkServer(host="127.0.0.1", port=0, record_path=tmp_path / "sink.jsonl",
                        keep_raw=True)
    server.start()
    yield server
    server.stop()


def settings(db_url: str, sink_port: int | None = None, **overrides: str) -> dict[str, str]:
    values = {
        "DATABASE_URL": db_url,
        "SMTP_URL": f"smtp://127.0.0.1:{sink_port or 1}?tls=none",
        "SECRET_KEY": "test-secret-key-not-for-production",
        "FROM": "SendDock Tests <tests@example.com>",
        "BASE_URL": "http://127.0.0.1:5000",
        "RETRY_JITTER": "0",
        "SMTP_TIMEOUT": "5",
        "HEARTBEAT_INTERVAL": "1",
        "WORKER_TIMEOUT": "5",
        # DNS checks (review page, senddock check) ask the tests' own server, never a
        # public resolver; tests publish records with the dns_server fixture.
        "DNS_RESOLVER": shared_dns_server().resolver_setting,
    }
    values.update(overrides)
    return values


@pytest.fixture()
def config_for(db_url: str) -> Callable[..., Config]:
    def make(sink_port: int | None = None, **overrides: str) -> Config:
        return load(settings(db_url, sink_port, **overrides))

    return make


@pytest.fixture()
def app(engine: sa.Engine, config_for: Callable[..., Config], sink: Any) -> Any:
    application = create_app(config_for(sink.port), engine=engine)
    application.config["TESTING"] = True
    return application


@pytest.fixture()
def client(app: Any) -> Any:
    return app.test_client()


@pytest.fixture()
def make_user(engine: sa.Engine) -> Callable[..., dict[str, Any]]:
    from webapp.domain import users

    def make(role: str = "admin", email: str | None = None,
             password: str = "correct horse battery") -> dict[str, Any]:
        with engine.begin() as conn:
            user = users.create_user(conn, email or f"{role}-{uuid.uuid4().hex[:6]}@example.com",
                                     password, role)
            user["token"] = users.create_token(conn, user["id"], "tests")
            user["password"] = password
        return user

    return make


class Api:
    """A JSON client with a bearer token."""

    def __init__(self, client: Any, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str) -> Any:
        return self.client.get(f"/api/v1{path}", headers=self.headers)

    def post(self, path: str, json: Any = None, **kw: Any) -> Any:
        return self.client.post(f"/api/v1{path}", json=json, headers=self.headers, **kw)

    def delete(self, path: str) -> Any:
        return self.client.delete(f"/api/v1{path}", headers=self.headers)


@pytest.fixture()
def api(client: Any, make_user: Callable[..., dict[str, Any]]) -> Api:
    return Api(client, make_user("admin")["token"])


def process_env(config_values: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env.update({f"SENDDOCK_{k}": v for k, v in config_values.items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A real ``senddock`` process (killed at the end of the test)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self.log = open(log, "ab")
        self.popen = subprocess.Popen([sys.executable, "-m", "webapp", *args], env=env,
                                      stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps what it holds but claims and marks nothing more, so
        what it has in flight can be counted before it is killed."""
        os.kill(self.popen.pid, signal.SIGSTOP)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.popen.terminate()
        return self.popen.wait(timeout)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")


@pytest.fixture()
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def start(args: list[str], config_values: dict[str, str]) -> Proc:
        proc = Proc(args, process_env(config_values), tmp_path / f"proc-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.log.close()


#: No wait gives up sooner than this: a wait is for a state or a count, and its timeout is
#: only the bound after which the test reports it as never reached. A busy machine (a
#: second suite beside this one) makes the state come later, not never.
MIN_WAIT = 60.0


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.1,
             message: str = "condition") -> Any:
    timeout = max(timeout, MIN_WAIT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
