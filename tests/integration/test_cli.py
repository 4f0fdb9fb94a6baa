"""The commands scripts use (docs/design.md §24): db upgrade, user create, token create, config
errors."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import ROOT, process_env, settings
from webapp.domain import users

pytestmark = pytest.mark.slow  # runs the senddock command in processes


def senddock(args: list[str], values: dict[str, str], stdin: str = "") -> Any:
    return subprocess.run([sys.executable, "-m", "webapp", *args], input=stdin,
                          capture_output=True, text=True, env=process_env(values), cwd=ROOT,
                          timeout=60)


def test_user_and_token_commands(engine: sa.Engine, db_url: str) -> None:
    values = settings(db_url)
    assert senddock(["db", "upgrade"], values).returncode == 0
    made = senddock(["user", "create", "ops@example.com", "--role", "admin",
                     "--password-stdin"], values, stdin="a long enough password\n")
    assert made.returncode == 0, made.stderr
    token = senddock(["token", "create", "--user", "ops@example.com"], values)
    assert token.returncode == 0, token.stderr
    lines = token.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sd_")  # the token alone on stdout
    with engine.begin() as conn:
        user = users.user_for_token(conn, lines[0])
        assert user is not None and user["email"] == "ops@example.com"
        assert user["role"] == "admin"
        stored = conn.execute(sa.text("SELECT token_hash FROM api_tokens")).scalar_one()
    assert lines[0] not in stored  # only a hash is kept
    scoped = senddock(["token", "create", "--user", "ops@example.com", "--scope", "send"],
                      values)
    assert scoped.returncode == 0, scoped.stderr
    with engine.begin() as conn:
        found = users.user_for_token(conn, scoped.stdout.strip())
    assert found is not None and found["scopes"] == ["send"]
    wrong = senddock(["token", "create", "--user", "ops@example.com", "--scope", "all"],
                     values)
    assert wrong.returncode != 0 and "unknown scope all" in wrong.stderr


def test_user_create_reports_bad_input(db_url: str) -> None:
    values = settings(db_url)
    short = senddock(["user", "create", "x@example.com", "--role", "admin",
                      "--password-stdin"], values, stdin="short\n")
    assert short.returncode != 0 and "at least" in short.stderr
    bad = senddock(["user", "create", "not-an-address", "--role", "admin",
                    "--password-stdin"], values, stdin="a long enough password\n")
    assert bad.returncode != 0 and "invalid email" in bad.stderr
    missing = senddock(["token", "create", "--user", "nobody@example.com"], values)
    assert missing.returncode != 0 and "no user" in missing.stderr


def test_worker_refuses_to_start_without_secret_key(db_url: str) -> None:
    values = settings(db_url)
    values["SECRET_KEY"] = ""
    result = senddock(["worker"], values)
    assert result.returncode != 0
    assert "SENDDOCK_SECRET_KEY" in result.stderr


def test_bad_setting_names_the_variable(db_url: str) -> None:
    result = senddock(["worker"], settings(db_url, WORKERS="many"))
    assert result.returncode != 0 and "SENDDOCK_WORKERS" in result.stderr
