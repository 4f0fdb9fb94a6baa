"""The libpq multi-host URL works for every command (docs/design.md §25): the first host is dead,
libpq goes on to the second; a bad URL is a one-line error naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa

from tests.conftest import ROOT, process_env, settings

pytestmark = pytest.mark.slow  # runs the senddock command in processes


def _multi_host(db_url: str) -> str:
    """The test server's URL with a dead first host before it. The live host is the URL's
    host, or its ``host`` parameter (a socket directory: the embedded fallback's URL)."""
    url = sa.make_url(db_url)
    host = url.host or str(url.query["host"])
    port = url.port or int(str(url.query.get("port", 5432)))
    # Port 1 on loopback refuses at once: libpq moves on to the live host.
    return (f"postgresql://{url.username}@/{url.database}?host=127.0.0.1,{host}"
            f"&port=1,{port}&target_session_attrs=read-write")


def _run(args: list[str], values: dict[str, str],
         stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webapp", *args], input=stdin,
                          env=process_env(values), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_every_command_with_a_multi_host_url(db_url: str) -> None:
    values = settings(_multi_host(db_url))
    assert _run(["db", "upgrade"], values).returncode == 0
    created = _run(["user", "create", "multi@example.com", "--role", "admin",
                    "--password-stdin"], values, "correct horse battery\n")
    assert created.returncode == 0, created.stderr
    token = _run(["token", "create", "--user", "multi@example.com"], values)
    assert token.returncode == 0 and token.stdout.strip().startswith("sd_"), token.stderr
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM users WHERE email = "
                                    "'multi@example.com'")).scalar() == 1
    engine.dispose()
    assert "Traceback" not in created.stderr + token.stderr


@pytest.mark.parametrize("command, bad", [
    (["worker"], "mysql://u@h/db"),
    (["serve", "--port", "0"], "postgresql://u@h:notaport/db"),
    (["db", "upgrade"], "postgresql://u@/db?host=a,b,c&port=1,2"),
])
def test_bad_url_is_one_line_naming_the_variable(command: list[str], bad: str) -> None:
    result = _run(command, settings(bad))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "SENDDOCK_DATABASE_URL" in lines[0] and "Traceback" not in result.stderr
