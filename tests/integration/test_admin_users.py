"""Users and tokens: disabling a user ends their sessions and tokens, revocation, role
changes, the last admin cannot lock everyone out, a new token is shown once."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser
from webapp.domain import audit, users
from webapp.domain.errors import Conflict


def test_disabling_a_user_kills_their_session_and_tokens(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    marketer = make_user("marketer")
    session = Browser(app.test_client(), marketer)
    assert session.get("/").status_code == 200
    api = Api(app.test_client(), marketer["token"])
    assert api.get("/lists").status_code == 200
    admin = Browser(app.test_client(), make_user("admin"))
    page = admin.post(f"/admin/users/{marketer['id']}/active", {"active": "0"})
    assert "their sessions ended" in page.get_data(as_text=True)
    after = session.get("/")
    assert after.status_code == 302 and "/login" in after.headers["Location"]
    assert api.get("/lists").status_code == 401
    admin.post(f"/admin/users/{marketer['id']}/active", {"active": "1"})
    assert api.get("/lists").status_code == 200  # the token works again; the session not
    assert session.get("/").status_code == 302
    with engine.connect() as conn:
        actions = [e["action"] for e in audit.entries(conn, target=f"user:{marketer['id']}")]
    assert actions[:2] == ["user.enable", "user.disable"]


def test_revoked_token_gets_401_and_new_token_is_shown_once(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    admin_user = make_user("admin")
    admin = Browser(app.test_client(), admin_user)
    page = admin.post("/admin/tokens/create", {"user_id": str(admin_user["id"]),
                                               "name": "prometheus",
                                               "scopes": ["admin"]})
    html = page.get_data(as_text=True)
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', html)[1]  # type: ignore[index]
    assert page.headers["Cache-Control"] == "no-store"
    client = app.test_client()
    assert client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code \
        == 200
    listing = admin.get("/admin/users").get_data(as_text=True)
    assert token not in listing and token[:10] in listing and "prometheus" in listing
    with app.extensions["senddock"].engine.connect() as conn:
        token_id = next(t["id"] for t in users.list_tokens(conn) if t["name"] == "prometheus")
        assert next(t for t in users.list_tokens(conn)
                    if t["id"] == token_id)["last_used_at"] is not None
    admin.post(f"/admin/tokens/{token_id}/revoke")
    assert client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code \
        == 401


def test_roles_change_and_the_last_admin_stays(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    admin_user = make_user("admin")
    other = make_user("support")
    with engine.begin() as conn:
        with pytest.raises(Conflict, match="last active admin"):
            users.set_active(conn, admin_user["id"], False, actor="x")
        with pytest.raises(Conflict, match="last active admin"):
            users.update_role(conn, admin_user["id"], "marketer", actor="x")
        users.update_role(conn, other["id"], "admin", actor="x")
    support_session = Browser(app.test_client(), other)
    assert support_session.get("/admin/users").status_code == 200  # now an admin
    admin = Browser(app.test_client(), admin_user)
    html = admin.post(f"/admin/users/{other['id']}/role", {"role": "nobody"}).get_data(
        as_text=True)
    assert "role must be one of" in html
    created = admin.post("/admin/users/create", {"email": "new@example.org", "role": "support",
                                                 "password": "short"})
    assert "at least 10 characters" in created.get_data(as_text=True)
    admin.post("/admin/users/create", {"email": "new@example.org", "role": "support",
                                       "password": "long enough password"})
    with engine.connect() as conn:
        assert users.find_user(conn, "new@example.org")["role"] == "support"  # type: ignore[index]
