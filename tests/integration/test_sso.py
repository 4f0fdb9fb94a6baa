"""Single sign-on against a real OpenID provider: the certified npm
package ``oidc-provider`` (harness/oidc/server.mjs), started here on a free port. Its own
sign-in form is driven over HTTP; its token endpoint answers SendDock's Authlib client.

Cases: the happy path (user created with the mapped role, logout ends the session), a claim
mapping to no role, a replayed state, and ID tokens the provider issues broken: for
another audience, expired, signed by a key not in its JWKS. And "SSO only" domains.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import requests
import sqlalchemy as sa

from tests.helpers import Browser
from tests.integration.security_fixtures import csrf_token
from webapp import create_app

HARNESS = Path(__file__).resolve().parents[2] / "harness" / "oidc"
CLIENT_ID, CLIENT_SECRET = "senddock", "harness-client-secret-0123456789"
BASE = "http://localhost"
ROLE_MAP = "senddock-admins=admin,marketing=marketer,helpdesk=support"


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: apt-get install nodejs npm, then "
                    "(cd harness/oidc && npm ci)")
    if not (HARNESS / "node_modules" / "oidc-provider").is_dir():
        pytest.skip("the OpenID provider harness is not installed: (cd harness/oidc && npm ci)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["node", "server.mjs", str(port)], cwd=HARNESS, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "CLIENT_ID": CLIENT_ID,
             "CLIENT_SECRET": CLIENT_SECRET, "REDIRECT_URI": f"{BASE}/login/sso/callback"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), f"the provider did not start: {line!r}"
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def sso_app(engine: sa.Engine, config_for: Callable[..., Any], provider: str) -> Any:
    def make(**extra: str) -> Any:
        values = {"BASE_URL": BASE, "OIDC_ISSUER": provider, "OIDC_CLIENT_ID": CLIENT_ID,
                  "OIDC_CLIENT_SECRET": CLIENT_SECRET, "OIDC_ROLE_MAP": ROLE_MAP,
                  "OIDC_CREATE_USERS": "on", "SSO_ONLY_DOMAINS": "corp.example", **extra}
        app = create_app(config_for(None, **values), engine=engine)
        app.config["TESTING"] = True
        return app
    return make


def _at_provider(authorize_url: str, login: str) -> str:
    """Sign in at the provider's own form and consent; returns the callback URL it sends
    the browser to (with code and state)."""
    browser = requests.Session()
    url = authorize_url
    for _ in range(12):
        answer = browser.get(url, allow_redirects=False, timeout=10)
        if answer.is_redirect:
            url = urljoin(url, answer.headers["Location"])
            if url.startswith(BASE):
                return url
            continue
        form = re.search(r'<form[^>]*action="([^"]+)"', answer.text)
        assert form, answer.text[:1000]
        prompt = re.search(r'name="prompt" value="(\w+)"', answer.text)
        assert prompt
        data = {"prompt": prompt[1]}
        if prompt[1] == "login":
            data.update(login=login, password="anything")
        posted = browser.post(urljoin(url, form[1]), data=data, allow_redirects=False,
                              timeout=10)
        assert posted.is_redirect, posted.text[:500]
        url = urljoin(url, posted.headers["Location"])
        if url.startswith(BASE):
            return url
    raise AssertionError("the provider never sent the browser back")


def _sign_in(app: Any, login: str, client: Any = None) -> tuple[Any, Any, str]:
    client = client or app.test_client()
    start = client.get("/login/sso?next=/lists/")
    assert start.status_code == 302, start.get_data(as_text=True)[:500]
    authorize = start.location
    query = dict(p.split("=", 1) for p in urlsplit(authorize).query.split("&"))
    assert query["code_challenge_method"] == "S256" and query["code_challenge"]
    assert query["state"] and query["nonce"]
    callback = _at_provider(authorize, login)
    parts = urlsplit(callback)
    answer = client.get(f"{parts.path}?{parts.query}")
    return client, answer, f"{parts.path}?{parts.query}"


def test_happy_path_creates_the_user_with_the_mapped_role_and_logout_ends_it(
        sso_app: Callable[..., Any], engine: sa.Engine) -> None:
    app = sso_app()
    login_page = app.test_client().get("/login").get_data(as_text=True)
    assert 'id="sso-login"' in login_page
    client, answer, callback = _sign_in(app, "ada@corp.example#staff,marketing")
    assert answer.status_code == 302 and answer.location.endswith("/lists/"), \
        answer.get_data(as_text=True)[:1000]
    assert client.get("/lists/").status_code == 200
    with engine.connect() as conn:
        user = conn.execute(sa.text("SELECT id, role FROM users WHERE email = "
                                    "'ada@corp.example'")).mappings().one()
        via = conn.execute(sa.text("SELECT details->>'via' FROM audit_log WHERE action = "
                                   "'user.login' AND target = :t"),
                           {"t": f"user:{user['id']}"}).scalar_one()
    assert user["role"] == "marketer" and via == "single sign-on"
    # The same callback again: its state was used once (and its code too).
    replay = client.get(callback)
    assert replay.status_code == 403
    # Logout ends the local session: the cookie copied before is worthless.
    saved = client.get_cookie("session")
    assert saved is not None
    csrf = re.search(r'name="csrf-token" content="([^"]+)"',
                     client.get("/account/").get_data(as_text=True))
    assert csrf
    assert client.post("/logout", data={"csrf_token": csrf[1]}).status_code == 302
    thief = app.test_client()
    thief.set_cookie("session", saved.value, domain="localhost")
    assert thief.get("/lists/").status_code == 302
    # A role changed at the provider is the role at the next sign-in.
    _, again, _ = _sign_in(app, "ada@corp.example#helpdesk")
    assert again.status_code == 302
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT role FROM users WHERE id = :i"),
                            {"i": user["id"]}).scalar_one() == "support"


def test_a_replayed_state_from_another_browser_is_refused(
        sso_app: Callable[..., Any], engine: sa.Engine) -> None:
    app = sso_app()
    victim = app.test_client()
    start = victim.get("/login/sso")
    callback = _at_provider(start.location, "eve@corp.example#marketing")
    parts = urlsplit(callback)
    # An attacker's browser (no state in its session) brings the callback: refused.
    attacker = app.test_client()
    refused = attacker.get(f"{parts.path}?{parts.query}")
    assert refused.status_code == 403
    assert "could not be verified" in refused.get_data(as_text=True)
    assert attacker.get("/lists/").status_code == 302
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM users WHERE email = "
                                    "'eve@corp.example'")).scalar_one() == 0


@pytest.mark.parametrize("mode", ["wrong-aud", "expired", "bad-sig"])
def test_a_broken_id_token_is_refused(mode: str, sso_app: Callable[..., Any],
                                      engine: sa.Engine) -> None:
    app = sso_app()
    client, answer, _ = _sign_in(app, f"mallory@corp.example#senddock-admins#{mode}")
    assert answer.status_code == 403, answer.get_data(as_text=True)[:500]
    assert "could not be verified" in answer.get_data(as_text=True)
    assert client.get("/lists/").status_code == 302
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM users WHERE email = "
                                    "'mallory@corp.example'")).scalar_one() == 0


def test_a_claim_mapping_to_no_role_is_refused(sso_app: Callable[..., Any],
                                               engine: sa.Engine,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    app = sso_app()
    client, answer, _ = _sign_in(app, "bob@corp.example#staff,sales")
    assert answer.status_code == 403
    assert "no SendDock role" in answer.get_data(as_text=True)
    assert client.get("/lists/").status_code == 302
    # An existing user whose claim maps to no role is refused too (and keeps their role).
    make_user("admin", email="carol@corp.example")
    _, refused, _ = _sign_in(app, "carol@corp.example")
    assert refused.status_code == 403
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT role FROM users WHERE email = "
                                    "'carol@corp.example'")).scalar_one() == "admin"


def test_without_user_creation_only_existing_users_sign_in(
        sso_app: Callable[..., Any], make_user: Callable[..., dict[str, Any]]) -> None:
    app = sso_app(OIDC_CREATE_USERS="off")
    _, refused, _ = _sign_in(app, "dan@corp.example#marketing")
    assert refused.status_code == 403 and "no SendDock user" in refused.get_data(as_text=True)
    make_user("marketer", email="dan@corp.example")
    _, ok, _ = _sign_in(app, "dan@corp.example#marketing")
    assert ok.status_code == 302


def test_sso_only_domains_are_refused_by_the_password_form(
        sso_app: Callable[..., Any], make_user: Callable[..., dict[str, Any]]) -> None:
    app = sso_app()
    user = make_user("admin", email="erin@corp.example")
    client = app.test_client()
    answer = client.post("/login", data={"email": user["email"], "password": user["password"],
                                         "csrf_token": csrf_token(client)})
    assert answer.status_code == 403
    assert "single sign-on, not a password" in answer.get_data(as_text=True)
    other = make_user("admin")  # another domain: the password form works
    Browser(app.test_client(), other)


def test_the_provider_cannot_demote_the_last_admin(sso_app: Callable[..., Any],
                                                   engine: sa.Engine,
                                                   make_user: Callable[..., dict[str, Any]]
                                                   ) -> None:
    app = sso_app()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE users SET role = 'marketer' WHERE role = 'admin'"))
    make_user("admin", email="root@corp.example")
    _, refused, _ = _sign_in(app, "root@corp.example#marketing")
    assert refused.status_code == 403 and "last active admin" in refused.get_data(as_text=True)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT role FROM users WHERE email = "
                                    "'root@corp.example'")).scalar_one() == "admin"
