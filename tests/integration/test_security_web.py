"""The browser-facing defences (P10): CSRF on every state-changing form and HTMX request,
session cookie flags, a Content-Security-Policy the pages never need to break, the usual
security headers, and ProxyFix behind an opt-in setting.

Routes and pages are discovered from ``app.url_map``, so new ones are checked too.
"""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.security_fixtures import Call, calls, login, seed, send
from webapp import create_app, security
from webapp.access import PUBLIC
from webapp.inbound_webhooks import registry

CSRF_MESSAGE = "The form expired or was not sent by SendDock"


@pytest.fixture()
def ids(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


@pytest.fixture()
def admin(app: Any, make_user: Callable[..., dict[str, Any]]) -> tuple[Any, str]:
    """A client logged in as an admin, and its CSRF token."""
    client = app.test_client()
    return client, login(client, make_user("admin"))


def _form_posts(app: Any, ids: dict[str, Any]) -> list[Call]:
    # Seeded ids: a missing CSRF check must not hide behind a 404.
    return [call for call in calls(app, ids, existing_for_writes=True)
            if call.method != "GET" and not call.is_api
            and call.endpoint != "public.unsubscribe_one_click"
            # Provider webhooks carry their own proof (signature, basic auth, webhook
            # token) instead of a session: test_webhook_posts_need_their_own_proof.
            and not call.endpoint.startswith("webhooks.")
            # Public subscription form and confirmation: a signed form token or link
            # instead (tests/integration/test_subscription_forms.py checks both).
            and call.endpoint not in security.SIGNED_PUBLIC_POSTS]


def test_every_form_post_without_a_token_is_refused(app: Any, ids: dict[str, Any],
                                                    admin: tuple[Any, str]) -> None:
    client, _ = admin
    posts = _form_posts(app, ids)
    assert len(posts) > 10, [str(c) for c in posts]  # the walk really found the forms
    wrong = []
    for call in posts:
        for headers in ({}, {"HX-Request": "true"}, {"X-CSRFToken": "forged"}):
            answer = client.open(call.url, method=call.method, data={"name": "x"},
                                 headers=headers)
            if answer.status_code != 400 or CSRF_MESSAGE not in answer.get_data(as_text=True):
                wrong.append(f"{call} {headers}: {answer.status_code}")
    assert not wrong, "state changed without a CSRF token:\n" + "\n".join(wrong)


def test_webhook_posts_need_their_own_proof(app: Any, ids: dict[str, Any],
                                            admin: tuple[Any, str]) -> None:
    """A logged-in admin's session (ambient credentials) opens no provider webhook: each
    answers 401/403 without its provider's proof, whatever the session."""
    client, _ = admin
    routes = [c for c in calls(app, ids, existing_for_writes=True)
              if c.endpoint.startswith("webhooks.")]
    assert [c.rule.rule for c in routes] == ["/webhooks/<name>"]
    assert set(registry.names()) == {"ses", "sendgrid", "postmark", "mailgun", "generic"}
    for name in registry.names():
        answer = client.post(f"/webhooks/{name}", json={"type": "bounce",
                                                         "email": "a@example.com"})
        assert answer.status_code in (400, 401, 403), (name, answer.status_code)


def test_one_click_unsubscribe_needs_no_token_but_a_signed_link(
        client: Any, ids: dict[str, Any]) -> None:
    # RFC 8058: mail clients POST without a session; the signed URL is the proof.
    assert client.post(f"/u/{ids['unsubscribe']}x").status_code in (400, 404)
    answer = client.post(f"/u/{ids['unsubscribe']}", data={"List-Unsubscribe": "One-Click"})
    assert answer.status_code == 200


def test_api_with_a_bearer_token_needs_no_csrf_token(api: Any) -> None:
    answer = api.post("/lists", {"name": "From a script"})
    assert answer.status_code == 201, answer.get_json()


def test_api_with_a_session_needs_the_csrf_token(app: Any, engine: sa.Engine,
                                                 admin: tuple[Any, str]) -> None:
    client, token = admin
    refused = client.post("/api/v1/lists", json={"name": "Forged"})
    assert refused.status_code == 400 and "fields" in refused.get_json()["error"]
    accepted = client.post("/api/v1/lists", json={"name": "Mine"},
                           headers={"X-CSRFToken": token})
    assert accepted.status_code == 201
    # A session plus a junk bearer header is not a way around the CSRF check.
    junk = client.post("/api/v1/lists", json={"name": "Forged 2"},
                       headers={"Authorization": "Bearer junk"})
    assert junk.status_code == 401
    with engine.connect() as conn:
        names = set(conn.execute(sa.text("SELECT name FROM lists")).scalars())
    assert "Mine" in names and not names & {"Forged", "Forged 2"}


def test_every_api_write_with_a_session_needs_the_token(app: Any, ids: dict[str, Any],
                                                         admin: tuple[Any, str]) -> None:
    client, _ = admin
    writes = [call for call in calls(app, ids, existing_for_writes=True)
              if call.is_api and call.method != "GET" and call.endpoint not in PUBLIC]
    assert writes
    wrong = [f"{call}: {answer.status_code}" for call in writes
             if (answer := send(client, call)).status_code != 400
             or CSRF_MESSAGE not in answer.get_data(as_text=True)]
    assert not wrong, "API writes accepted from a session without a CSRF token:\n" + \
        "\n".join(wrong)


def _session_cookie(answer: Any) -> str:
    cookies = [c for c in answer.headers.getlist("Set-Cookie") if c.startswith("session=")]
    assert cookies, answer.headers
    return cookies[-1]


def _login_answer(app: Any, user: dict[str, Any]) -> Any:
    from tests.integration.security_fixtures import csrf_token

    client = app.test_client()
    return client.post("/login", data={"email": user["email"], "password": user["password"],
                                       "csrf_token": csrf_token(client)})


def test_session_cookie_is_httponly_and_samesite_lax(app: Any,
                                                     make_user: Callable[..., Any]) -> None:
    cookie = _session_cookie(_login_answer(app, make_user("admin")))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # served over http://127.0.0.1 in the tests


def test_session_cookie_is_secure_behind_https(engine: sa.Engine, sink: Any,
                                               config_for: Callable[..., Any],
                                               make_user: Callable[..., Any]) -> None:
    app = create_app(config_for(sink.port, BASE_URL="https://mail.example.com"),
                     engine=engine)
    cookie = _session_cookie(_login_answer(app, make_user("admin")))
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie


def _check_headers(answer: Any) -> list[str]:
    csp = answer.headers.get("Content-Security-Policy", "")
    # A sandboxed preview (a marketer's own HTML) may be framed by our own pages only.
    sandboxed = csp.startswith("sandbox;") and "frame-ancestors 'self'" in csp
    expected = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
                "X-Frame-Options": "SAMEORIGIN" if sandboxed else "DENY"}
    wrong = [f"{name}={answer.headers.get(name)!r}" for name, value in expected.items()
             if answer.headers.get(name) != value]
    if csp != security.CSP and not sandboxed:
        wrong.append(f"CSP={csp!r}")
    return wrong


class InlineCode(HTMLParser):
    """Collects what the CSP would block: inline scripts and styles, handler attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and not names.get("src"):
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style> element")
        for name, value in attrs:
            if name == "style" or name.startswith(("on", "hx-on")):
                self.found.append(f"<{tag} {name}=...>")
            if (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:...>")


def inline_code(html: str) -> list[str]:
    parser = InlineCode()
    parser.feed(html)
    return parser.found


def test_inline_code_detector_finds_what_csp_blocks() -> None:
    assert inline_code('<p style="color:red" onclick="x()"><script>1</script>') == [
        "<p style=...>", "<p onclick=...>", "<script> without src"]
    assert inline_code('<script src="/static/js/app.js"></script><a href="/x">x</a>') == []


def _pages(app: Any, ids: dict[str, Any]) -> list[Call]:
    return [call for call in calls(app, ids) if call.method == "GET"
            and call.endpoint != "static"]


def test_pages_need_no_inline_script_or_style_and_carry_the_headers(
        app: Any, ids: dict[str, Any], admin: tuple[Any, str]) -> None:
    client, _ = admin
    problems, html_pages = [], 0
    for call in _pages(app, ids):
        for headers in ({}, {"HX-Request": "true"}):
            answer = send(client, call, headers=headers)
            if answer.status_code >= 500:
                problems.append(f"{call}: {answer.status_code}")
            problems += [f"{call}: {p}" for p in _check_headers(answer)]
            csp = answer.headers.get("Content-Security-Policy", "")
            if answer.mimetype == "text/html" and not csp.startswith("sandbox"):
                html_pages += 1
                problems += [f"{call} {headers}: {p}"
                             for p in inline_code(answer.get_data(as_text=True))]
    assert html_pages > 15
    assert not problems, "\n".join(problems)


def test_marketer_html_preview_is_sandboxed(app: Any, ids: dict[str, Any],
                                           admin: tuple[Any, str]) -> None:
    # The one page that shows a marketer's own HTML runs it in a CSP sandbox (a unique
    # origin with no script), never under the app's origin.
    client, _ = admin
    previews = [c for c in _pages(app, ids) if c.endpoint == "campaigns.preview_html"]
    assert previews
    for call in previews:
        csp = send(client, call).headers["Content-Security-Policy"]
        assert csp.startswith("sandbox;") and "default-src 'none'" in csp
        assert "script-src" not in csp and "allow-scripts" not in csp


def test_errors_and_api_answers_carry_the_headers(app: Any, client: Any, api: Any) -> None:
    for answer in (client.get("/no/such/page"), client.get("/login"),
                   api.get("/lists"), api.get("/campaigns/987654321"),
                   client.get("/api/v1/lists")):
        assert not _check_headers(answer), answer.headers
    assert api.get("/lists").headers["Cache-Control"] == "no-store"


def test_hsts_over_https_only(client: Any) -> None:
    assert "Strict-Transport-Security" not in client.get("/login").headers
    secure = client.get("/login", base_url="https://localhost")
    assert secure.headers["Strict-Transport-Security"].startswith("max-age=")


def test_proxy_fix_is_opt_in(engine: sa.Engine, sink: Any,
                             config_for: Callable[..., Any]) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.5",
                 "X-Forwarded-Host": "mail.example.com"}
    plain = create_app(config_for(sink.port), engine=engine).test_client()
    assert "Strict-Transport-Security" not in plain.get("/login", headers=forwarded).headers
    proxied = create_app(config_for(sink.port, PROXY_FIX="1"), engine=engine).test_client()
    answer = proxied.get("/campaigns/", headers=forwarded)
    assert "Strict-Transport-Security" in answer.headers
    assert answer.headers["Location"].startswith("/login")
