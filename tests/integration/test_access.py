"""The role matrix (P10), checked against every route the app registers.

Routes are discovered from ``app.url_map``: a route added without an entry in
:mod:`webapp.access` fails ``test_every_endpoint_is_in_the_matrix``, and one whose answer
disagrees with the matrix fails the walks below (anonymous, each role with a session,
each role with a bearer token on the API).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.security_fixtures import ROLES, Call, calls, login, seed, send
from webapp import access


@pytest.fixture()
def ids(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


def test_every_endpoint_is_in_the_matrix(app: Any) -> None:
    missing = sorted({rule.endpoint for rule in app.url_map.iter_rules()
                      if access.allowed_roles(rule.endpoint) is None})
    assert not missing, f"endpoints without an entry in webapp/access.py: {missing}"


def test_an_unknown_endpoint_is_refused() -> None:
    assert access.allowed_roles("api.something_new") is None
    assert access.allowed_roles("nowhere") is None
    assert access.allowed_roles(None) is None


def _anonymous_problem(call: Call, answer: Any) -> str | None:
    status = answer.status_code
    if status >= 500:
        return f"{status} (server error)"
    if call.endpoint in access.PUBLIC:
        return None  # each checks its own proof (login form, signed link), not a role
    if call.is_api:
        return None if status == 401 else f"{status}, expected 401"
    location = answer.headers.get("Location", "")
    if status != 302 or not location.startswith("/login"):
        return f"{status} to {location!r}, expected a 302 to /login"
    return None


def test_anonymous_is_sent_to_login_or_refused(app: Any, ids: dict[str, Any]) -> None:
    client = app.test_client()
    problems = [f"{call}: {problem}" for call in calls(app, ids)
                if (problem := _anonymous_problem(call, send(client, call)))]
    assert not problems, "\n".join(problems)


def _role_problem(role: str, call: Call, answer: Any) -> str | None:
    allowed = access.allowed_roles(call.endpoint) or frozenset()
    status = answer.status_code
    if status >= 500:
        return f"{status} (server error)"
    if call.endpoint in access.PUBLIC:
        return None  # a wrong password on /login is 401 whatever the session's role
    if role not in allowed:
        return None if status == 403 else f"{status}, expected 403"
    if status in (401, 403):
        return f"{status} although the matrix allows {role}"
    return None


@pytest.mark.parametrize("role", ROLES)
def test_each_role_with_a_session_gets_what_the_matrix_says(
        role: str, app: Any, ids: dict[str, Any],
        make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user(role)
    client = app.test_client()
    csrf = login(client, user)
    problems = []
    for call in calls(app, ids):
        answer = send(client, call, csrf=csrf)
        if problem := _role_problem(role, call, answer):
            problems.append(f"{call}: {problem}")
        if call.endpoint in ("auth.logout", "auth.login") and call.method == "POST":
            csrf = login(client, user)  # the walk logged us out (or tried a bad login)
    assert not problems, f"as {role}:\n" + "\n".join(problems)


def _bearer_problem(role: str, call: Call, answer: Any) -> str | None:
    if "form expired" in answer.get_data(as_text=True):
        return "refused for a missing CSRF token, although a bearer call needs none"
    return _role_problem(role, call, answer)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_with_a_bearer_token_gets_what_the_matrix_says(
        role: str, app: Any, ids: dict[str, Any],
        make_user: Callable[..., dict[str, Any]]) -> None:
    bearer = {"Authorization": f"Bearer {make_user(role)['token']}"}
    client = app.test_client()
    problems = [f"{call}: {problem}" for call in calls(app, ids) if call.is_api
                if (problem := _bearer_problem(role, call, send(client, call, headers=bearer)))]
    assert not problems, f"as {role} (token):\n" + "\n".join(problems)


def test_a_route_missing_from_the_matrix_is_closed_to_everyone(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    # Deny by default: a route registered without a matrix entry is refused, not open.
    app.add_url_rule("/forgotten", endpoint="forgotten.page", view_func=lambda: "open")
    app.add_url_rule("/api/v1/forgotten", endpoint="api.forgotten", view_func=lambda: "open")
    admin = make_user("admin")
    client = app.test_client()
    assert client.get("/api/v1/forgotten").status_code == 401
    assert client.get("/api/v1/forgotten", headers={
        "Authorization": f"Bearer {admin['token']}"}).status_code == 403
    login(client, admin)
    assert client.get("/forgotten").status_code == 403


def test_a_wrong_or_revoked_token_is_401(app: Any, engine: sa.Engine,
                                        make_user: Callable[..., dict[str, Any]]) -> None:
    from webapp.domain import users

    client = app.test_client()
    admin = make_user("admin")
    for header in ("Bearer sd_not-a-token", "Bearer ", "Basic YWRtaW46YWRtaW4=",
                   f"Bearer {admin['token']}x"):
        answer = client.get("/api/v1/lists", headers={"Authorization": header})
        assert answer.status_code == 401, header
        assert answer.get_json()["error"]["message"]
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    with engine.begin() as conn:
        token_id = conn.execute(sa.text("SELECT id FROM api_tokens WHERE user_id = :u"),
                                {"u": admin["id"]}).scalar_one()
        users.revoke_token(conn, token_id, actor="tests")
    answer = client.get("/api/v1/lists", headers={"Authorization": f"Bearer {admin['token']}"})
    assert answer.status_code == 401


def test_a_bearer_token_does_not_open_the_pages(app: Any,
                                                make_user: Callable[..., dict[str, Any]]
                                                ) -> None:
    # Tokens are for the API (and /metrics); the pages need a session.
    client = app.test_client()
    bearer = {"Authorization": f"Bearer {make_user('admin')['token']}"}
    answer = client.get("/admin/users", headers=bearer)
    assert answer.status_code == 302 and answer.headers["Location"].startswith("/login")


def test_the_security_page_shows_the_matrix_the_code_enforces(app: Any) -> None:
    # docs/security.md and webapp/access.py are one source: the page's table is generated
    # from the matrix and the registered routes (python -m webapp.access_docs).
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(
        encoding="utf-8")
    expected = access.markdown_table(app.url_map.iter_rules())
    assert access.rewrite_docs(page, expected) == page, \
        "docs/security.md's role matrix is out of date: run python -m webapp.access_docs"
