"""Scoped API tokens: every API route walked with a token of each
scope, as the role matrix walk does (tests/integration/test_access.py); a token is never
wider than its owner's role; revoking, expiry and last use (time and address)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from tests.integration.security_fixtures import Call, calls, seed, send
from webapp import access
from webapp.domain import users
from webapp.domain.errors import Invalid


@pytest.fixture()
def ids(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


def _token(engine: sa.Engine, user: dict[str, Any], scopes: list[str], **kw: Any) -> str:
    with engine.begin() as conn:
        return users.create_token(conn, user["id"], "scoped", scopes=scopes, actor="tests",
                                  **kw)


def test_every_api_endpoint_names_its_scope(app: Any) -> None:
    api = {rule.endpoint for rule in app.url_map.iter_rules()
           if (rule.rule.startswith("/api/") or rule.rule == "/metrics")
           and rule.endpoint not in access.PUBLIC}
    assert api, "no API routes found"
    missing = sorted(api - set(access.ENDPOINT_SCOPES))
    assert not missing, f"API endpoints without a scope in webapp/access.py: {missing}"
    assert set(access.ENDPOINT_SCOPES.values()) <= set(access.SCOPES)
    for role, held in access.ROLE_SCOPES.items():
        # A role's scopes open only endpoints the role itself may call.
        for endpoint, scope in access.ENDPOINT_SCOPES.items():
            if scope in held and scope != access.ADMIN_SCOPE:
                assert role in (access.allowed_roles(endpoint) or ()), (role, endpoint)


def _scope_problem(scope: str, call: Call, answer: Any) -> str | None:
    status = answer.status_code
    if status >= 500:
        return f"{status} (server error)"
    if call.endpoint in access.PUBLIC:
        return None
    if not access.token_allows([scope], call.endpoint):
        body = answer.get_json(silent=True) or {}
        if status != 403:
            return f"{status}, expected 403"
        if "scope" not in body.get("error", {}).get("message", ""):
            return f"403 without naming the scope: {body}"
        return None
    if status in (401, 403):
        return f"{status} although the scope {scope} allows it"
    return None


@pytest.mark.parametrize("scope", access.SCOPES)
def test_each_scope_walks_every_api_route(scope: str, app: Any, engine: sa.Engine,
                                          ids: dict[str, Any],
                                          make_user: Callable[..., dict[str, Any]]) -> None:
    # An admin owner: the role allows every API route, so only the scope decides.
    bearer = {"Authorization": f"Bearer {_token(engine, make_user('admin'), [scope])}"}
    client = app.test_client()
    walked = [call for call in calls(app, ids) if call.is_api]
    assert len(walked) >= 30
    problems = [f"{call}: {problem}" for call in walked
                if (problem := _scope_problem(scope, call, send(client, call,
                                                                headers=bearer)))]
    assert not problems, f"scope {scope}:\n" + "\n".join(problems)


def test_a_send_only_token_sends_and_gets_403_on_everything_else(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    support = make_user("support")
    bearer = {"Authorization": f"Bearer {_token(engine, support, ['send'])}"}
    client = app.test_client()
    sent = client.post("/api/v1/verifications", headers=bearer, json={
        "user_id": "u-1", "email": "someone@example.org",
        "verify_url": "https://app.example.com/verify?t=1"})
    assert sent.status_code == 202, sent.get_data(as_text=True)
    job = sent.get_json()["id"]
    refused = client.get(f"/api/v1/jobs/{job}", headers=bearer)
    assert refused.status_code == 403
    assert "read_jobs" in refused.get_json()["error"]["message"]
    for path in ("/api/v1/lists", "/api/v1/suppressions", "/metrics"):
        assert client.get(path, headers=bearer).status_code == 403, path


def test_a_token_is_never_wider_than_its_owner_role(
        engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    marketer, support = make_user("marketer"), make_user("support")
    for user, scopes in ((marketer, ["send"]), (marketer, ["admin"]), (support, ["campaigns"]),
                         (support, []), (support, ["everything"])):
        with pytest.raises(Invalid):
            _token(engine, user, scopes)
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM api_tokens WHERE name = 'scoped'")).scalar_one() == 0
    # Default: every scope the role may hold; a role that narrows later narrows the token.
    with engine.begin() as conn:
        users.create_token(conn, marketer["id"], "default", actor="tests")
        held = conn.execute(sa.text("SELECT scopes FROM api_tokens WHERE name = 'default'")
                            ).scalar_one()
    assert held == ["read_jobs", "campaigns"]


def test_a_role_change_narrows_an_admin_scoped_token(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    owner = make_user("admin")
    make_user("admin")  # someone stays admin
    bearer = {"Authorization": f"Bearer {_token(engine, owner, ['admin'])}"}
    client = app.test_client()
    assert client.get("/api/v1/suppressions", headers=bearer).status_code == 200
    with engine.begin() as conn:
        users.update_role(conn, owner["id"], "marketer", actor="tests")
    assert client.get("/api/v1/suppressions", headers=bearer).status_code == 403
    assert client.get("/api/v1/lists", headers=bearer).status_code == 200


def test_revoke_and_expiry_take_effect_on_the_next_request_and_last_use_is_kept(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    owner = make_user("marketer")
    token = _token(engine, owner, ["campaigns"], expires_in_days=30)
    client = app.test_client()
    bearer = {"Authorization": f"Bearer {token}"}
    answer = client.get("/api/v1/lists", headers=bearer,
                        environ_base={"REMOTE_ADDR": "198.51.100.7"})
    assert answer.status_code == 200
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT id, last_used_at, last_used_addr FROM api_tokens "
                                   "WHERE name = 'scoped'")).mappings().one()
    assert row["last_used_at"] is not None and row["last_used_addr"] == "198.51.100.7"
    # Another address is noted at once (not only once a minute).
    client.get("/api/v1/lists", headers=bearer, environ_base={"REMOTE_ADDR": "203.0.113.9"})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT last_used_addr FROM api_tokens WHERE id = :i"),
                            {"i": row["id"]}).scalar_one() == "203.0.113.9"
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE api_tokens SET expires_at = now() - interval '1 second' "
                             "WHERE id = :i"), {"i": row["id"]})
    users.forget_tokens()  # the expiry was moved behind the process's back
    assert client.get("/api/v1/lists", headers=bearer).status_code == 401
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE api_tokens SET expires_at = NULL WHERE id = :i"),
                     {"i": row["id"]})
    users.forget_tokens()
    assert client.get("/api/v1/lists", headers=bearer).status_code == 200
    with engine.begin() as conn:
        users.revoke_token(conn, row["id"], actor="tests")
    assert client.get("/api/v1/lists", headers=bearer).status_code == 401


def test_the_token_page_creates_scoped_tokens_and_shows_them(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = make_user("admin")
    support = make_user("support")
    browser = Browser(app.test_client(), admin)
    page = browser.get("/admin/users").get_data(as_text=True)
    for scope in access.SCOPES:
        assert f'name="scopes" value="{scope}"' in page
    # Wider than the role: refused with the reason, the form kept, nothing created.
    refused = browser.post("/admin/tokens/create", {
        "user_id": str(support["id"]), "name": "too wide", "expires": "30",
        "scopes": ["send", "campaigns"]}).get_data(as_text=True)
    assert "never wider than its owner" in refused
    assert 'value="send" checked' in refused and 'value="too wide"' in refused
    none = browser.post("/admin/tokens/create", {
        "user_id": str(support["id"]), "name": "none", "expires": "30"}
    ).get_data(as_text=True)
    assert "at least one scope" in none
    created = browser.post("/admin/tokens/create", {
        "user_id": str(support["id"]), "name": "signup app", "expires": "30",
        "scopes": ["send"]}).get_data(as_text=True)
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', created)
    assert token
    client = app.test_client()
    assert client.get("/api/v1/kinds", headers={
        "Authorization": f"Bearer {token[1]}"}).status_code == 200
    listing = browser.get("/admin/users").get_data(as_text=True)
    row = re.search(r"<tr[^>]*>\s*<td><code>[^<]+</code></td>\s*<td>signup app</td>.*?</tr>",
                    listing, re.S)
    assert row and ">send</span>" in row[0] and "from 127.0.0.1" in row[0]
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM api_tokens WHERE name IN ('too wide', 'none')")
        ).scalar_one() == 0
        entry = conn.execute(sa.text(
            "SELECT details FROM audit_log WHERE action = 'token.create' "
            "ORDER BY id DESC LIMIT 1")).scalar_one()
    assert entry["scopes"] == ["send"]


def test_the_scopes_table_in_the_docs_is_the_code() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert f"{access.SCOPES_DOCS_START}\n{access.scopes_table()}\n{access.SCOPES_DOCS_END}" \
        in docs, "run `python -m webapp.access_docs`"
