"""Logins, sessions and API tokens (docs/design.md §23, P10): argon2 hashes, a limit on failed
logins per account and per address, sessions that end when a user is disabled or their password
changes, tokens stored hashed, revocable, tied to a user and a role, their last use kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import sqlalchemy as sa

from tests.integration.security_fixtures import csrf_token, login
from webapp.domain import users


def _try_login(client: Any, email: str, password: str, next_url: str | None = None,
               addr: str = "198.51.100.7") -> Any:
    path = "/login" + (f"?next={next_url}" if next_url is not None else "")
    return client.post(path, data={"email": email, "password": password,
                                   "csrf_token": csrf_token(client)},
                       environ_base={"REMOTE_ADDR": addr})


def test_passwords_are_stored_as_argon2_hashes(engine: sa.Engine,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    user = make_user("marketer", password="a long enough secret")
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT password_hash FROM users WHERE id = :id"),
                              {"id": user["id"]}).scalar_one()
    assert stored.startswith("$argon2id$") and "a long enough secret" not in stored
    assert users.verify_password(stored, "a long enough secret")
    assert not users.verify_password(stored, "a long enough secreT")


def test_failed_logins_are_limited_per_account(client: Any,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    user = make_user("admin")
    for _ in range(users.MAX_FAILED_PER_ACCOUNT):
        answer = _try_login(client, user["email"], "wrong password!")
        assert answer.status_code == 401
        assert "Wrong email or password." in answer.get_data(as_text=True)
    # Now even the right password is refused, from another address too, with a clear message.
    answer = _try_login(client, user["email"].upper(), user["password"], addr="203.0.113.9")
    assert answer.status_code == 429
    assert "Too many failed attempts" in answer.get_data(as_text=True)
    assert client.get("/").status_code == 302  # still not logged in


def test_failed_logins_are_limited_per_address(client: Any,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    user = make_user("marketer")
    for n in range(users.MAX_FAILED_PER_ADDRESS):
        assert _try_login(client, f"guess{n}@example.org", "wrong password!").status_code == 401
    assert _try_login(client, user["email"], user["password"]).status_code == 429
    # Another address is not punished for this one's guessing.
    assert _try_login(client, user["email"], user["password"], addr="192.0.2.1"
                      ).status_code == 302


def test_a_disabled_or_unknown_user_gets_the_same_answer(client: Any, engine: sa.Engine,
                                                         make_user: Callable[..., Any]
                                                         ) -> None:
    make_user("admin")  # someone must stay admin
    user = make_user("marketer")
    with engine.begin() as conn:
        users.set_active(conn, user["id"], False, actor="tests")
    disabled = _try_login(client, user["email"], user["password"])
    unknown = _try_login(client, "nobody@example.org", user["password"])
    assert disabled.status_code == unknown.status_code == 401
    assert "Wrong email or password." in disabled.get_data(as_text=True)


@pytest.mark.parametrize("target", [
    "//evil.example/", "/\\evil.example/", "https://evil.example/", "/\\/evil.example",
    "\\\\evil.example", "javascript:alert(1)", "/%5Cevil.example", " //evil.example"])
def test_login_never_redirects_off_site(client: Any, target: str,
                                        make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("admin")
    answer = _try_login(client, user["email"], user["password"], next_url=target)
    assert answer.status_code == 302
    # Resolved as a browser does (it reads a backslash as a slash), it stays on our host.
    location = answer.headers["Location"]
    resolved = urlsplit(urljoin("http://senddock.test/login", location.replace("\\", "/")))
    assert resolved.scheme == "http" and resolved.netloc == "senddock.test", location


def test_login_follows_a_local_next(client: Any,
                                    make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("admin")
    answer = _try_login(client, user["email"], user["password"], next_url="/campaigns/")
    assert answer.headers["Location"] == "/campaigns/"


def test_disabling_a_user_ends_their_sessions_and_tokens(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    make_user("admin")
    user = make_user("marketer")
    client = app.test_client()
    login(client, user)
    assert client.get("/campaigns/").status_code == 200
    bearer = {"Authorization": f"Bearer {user['token']}"}
    assert client.get("/api/v1/lists", headers=bearer).status_code == 200
    with engine.begin() as conn:
        users.set_active(conn, user["id"], False, actor="tests")
    answer = client.get("/campaigns/")
    assert answer.status_code == 302 and answer.headers["Location"].startswith("/login")
    assert app.test_client().get("/api/v1/lists", headers=bearer).status_code == 401
    with engine.begin() as conn:  # enabling again does not revive the old session
        users.set_active(conn, user["id"], True, actor="tests")
    assert client.get("/campaigns/").status_code == 302


def test_a_password_change_ends_every_session(app: Any, engine: sa.Engine,
                                              make_user: Callable[..., dict[str, Any]]
                                              ) -> None:
    user = make_user("support")
    first, second = app.test_client(), app.test_client()
    login(first, user)
    login(second, user)
    with engine.begin() as conn:
        users.set_password(conn, user["id"], "a brand new password", actor="tests")
    for client in (first, second):
        assert client.get("/support/").status_code == 302
    login(first, {**user, "password": "a brand new password"})
    assert first.get("/support/").status_code == 200


def test_a_forged_session_cookie_is_not_accepted(app: Any,
                                                 make_user: Callable[..., dict[str, Any]]
                                                 ) -> None:
    from flask.sessions import SecureCookieSessionInterface

    user = make_user("admin")
    forger = app.test_client()
    other_key = app.__class__(app.import_name)
    other_key.secret_key = "not the real key"
    serializer = SecureCookieSessionInterface().get_signing_serializer(other_key)
    assert serializer is not None
    cookie = serializer.dumps({"_user_id": f"{user['id']}:0", "_fresh": True})
    forger.set_cookie("session", cookie)
    assert forger.get("/admin/users").status_code == 302


def test_tokens_are_stored_hashed_and_record_their_last_use(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    token = user["token"]
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM api_tokens WHERE user_id = :u"),
                           {"u": user["id"]}).mappings().one()
    assert token not in " ".join(str(v) for v in row.values())
    assert row["prefix"] == token[:10] and row["last_used_at"] is None
    assert app.test_client().get("/api/v1/lists", headers={
        "Authorization": f"Bearer {token}"}).status_code == 200
    with engine.connect() as conn:
        listed = next(t for t in users.list_tokens(conn) if t["id"] == row["id"])
    assert listed["last_used_at"] is not None and listed["email"] == user["email"]
    assert "token_hash" not in listed  # the admin page never gets the hash either


def test_a_token_acts_with_its_users_current_role(app: Any, engine: sa.Engine,
                                                  make_user: Callable[..., dict[str, Any]]
                                                  ) -> None:
    make_user("admin")
    user = make_user("marketer")
    bearer = {"Authorization": f"Bearer {user['token']}"}
    client = app.test_client()
    assert client.get("/api/v1/lists", headers=bearer).status_code == 200
    assert client.get("/api/v1/suppressions", headers=bearer).status_code == 403
    with engine.begin() as conn:
        users.update_role(conn, user["id"], "support", actor="tests")
    assert client.get("/api/v1/lists", headers=bearer).status_code == 403
    with engine.begin() as conn:
        user_for = users.user_for_token(conn, user["token"])
    assert user_for is not None and user_for["role"] == "support"


def test_a_revoked_token_stops_working_and_the_revocation_is_audited(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("admin")
    with engine.begin() as conn:
        second = users.create_token(conn, user["id"], "ci", actor="tests")
        token_id = conn.execute(sa.text("SELECT id FROM api_tokens WHERE name = 'ci'")
                                ).scalar_one()
        users.revoke_token(conn, token_id, actor="tests")
        assert users.user_for_token(conn, second) is None
        assert users.user_for_token(conn, user["token"]) is not None
        actions = set(conn.execute(sa.text("SELECT action FROM audit_log")).scalars())
    assert {"token.create", "token.revoke"} <= actions
    answer = app.test_client().get("/api/v1/lists",
                                   headers={"Authorization": f"Bearer {second}"})
    assert answer.status_code == 401


def _simultaneous_logins(app: Any, tries: list[tuple[str, str, str]]) -> list[int]:
    """POST /login for every (email, password, address) at the same moment, each from its
    own client; the statuses in order."""
    import threading

    clients = [app.test_client() for _ in tries]
    tokens = [csrf_token(c) for c in clients]
    gate = threading.Barrier(len(tries))
    statuses = [0] * len(tries)

    def attempt(i: int) -> None:
        email, password, addr = tries[i]
        gate.wait(timeout=60)
        statuses[i] = clients[i].post("/login", data={
            "email": email, "password": password, "csrf_token": tokens[i]},
            environ_base={"REMOTE_ADDR": addr}).status_code

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(tries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return statuses


def _failures(engine: sa.Engine, **where: str) -> int:
    column, value = next(iter(where.items()))
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            f"SELECT count(*) FROM login_attempts WHERE NOT succeeded AND {column} = :v"),
            {"v": value}).scalar_one())


@pytest.mark.parametrize("sent", [16, 40])
def test_simultaneous_wrong_passwords_are_each_counted_and_the_account_limit_holds(
        sent: int, app: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    """16-40 wrong passwords at once recorded 7-22 failures and
    checked more passwords than the limit allows (the count was read before any insert)."""
    user = make_user("admin")
    statuses = _simultaneous_logins(app, [(user["email"], "wrong password!", f"10.0.{i}.1")
                                          for i in range(sent)])
    assert sorted(statuses) == [401] * users.MAX_FAILED_PER_ACCOUNT + [429] * (
        sent - users.MAX_FAILED_PER_ACCOUNT)
    assert _failures(engine, email=user["email"]) == sent
    client = app.test_client()
    assert _try_login(client, user["email"], user["password"], addr="10.9.9.9"
                      ).status_code == 429


def test_simultaneous_wrong_passwords_from_one_address_hold_its_limit(
        app: Any, engine: sa.Engine) -> None:
    sent = users.MAX_FAILED_PER_ADDRESS + 12
    statuses = _simultaneous_logins(app, [(f"who{i}@example.org", "wrong password!",
                                           "192.0.2.77") for i in range(sent)])
    assert sorted(statuses) == [401] * users.MAX_FAILED_PER_ADDRESS + [429] * 12
    assert _failures(engine, remote_addr="192.0.2.77") == sent


def test_the_current_password_check_on_the_account_page_is_limited(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """A stolen session guessed the current password 42 times, then
    changed it with the right one."""
    user = make_user("marketer")
    csrf = login(client, user)
    statuses = []
    for n in range(users.MAX_FAILED_PER_ACCOUNT + 3):
        statuses.append(client.post("/account/password", data={
            "current": f"guess number {n}", "password": "a new password!!",
            "confirm": "a new password!!", "csrf_token": csrf}).status_code)
    assert statuses == [422] * users.MAX_FAILED_PER_ACCOUNT + [429] * 3
    right = client.post("/account/password", data={
        "current": user["password"], "password": "a new password!!",
        "confirm": "a new password!!", "csrf_token": csrf})
    assert right.status_code == 429  # the right one too, until the window passes
    assert "Too many failed attempts" in right.get_data(as_text=True)
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT password_hash FROM users WHERE id = :id"),
                              {"id": user["id"]}).scalar_one()
    assert users.verify_password(stored, user["password"])  # unchanged


def test_a_right_current_password_is_not_counted_as_a_failure(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    csrf = login(client, user)
    for _ in range(users.MAX_FAILED_PER_ACCOUNT + 2):
        answer = client.post("/account/password", data={
            "current": user["password"], "password": "x", "confirm": "y",
            "csrf_token": csrf})
        assert answer.status_code == 422  # confirmation differs: refused, but not a guess
    assert _failures(engine, email=user["email"]) == 0


def test_login_gives_a_new_csrf_token(app: Any,
                                      make_user: Callable[..., dict[str, Any]]) -> None:
    """The CSRF token was the same before and after login, so a token
    planted or read before the login stayed good for the logged-in session."""
    user = make_user("admin")
    client = app.test_client()
    before = csrf_token(client)
    assert client.post("/login", data={"email": user["email"], "password": user["password"],
                                       "csrf_token": before}).status_code == 302
    after = csrf_token(client)
    assert after != before
    stale = client.post("/admin/suppressions/add", data={
        "emails": "stale@example.com", "reason": "manual", "csrf_token": before})
    assert stale.status_code == 400
    fresh = client.post("/admin/suppressions/add", data={
        "emails": "fresh@example.com", "reason": "manual", "csrf_token": after})
    assert fresh.status_code == 302
