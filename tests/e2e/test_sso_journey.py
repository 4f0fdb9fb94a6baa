"""Single sign-on in a real browser, in English and Spanish (docs/security.md): from
SendDock's login page, through a real OpenID provider's own sign-in and consent pages
(the npm package ``oidc-provider``, harness/oidc), back into SendDock signed in with the
role the provider's groups map to; the account page lists the session; logging out ends
it."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Proc, free_port, settings, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
HARNESS = Path(__file__).resolve().parents[2] / "harness" / "oidc"
CLIENT_ID, CLIENT_SECRET = "senddock", "harness-client-secret-0123456789"


@pytest.fixture()
def served(db_url: str, sink: Any, spawn: Callable[..., Proc]) -> Iterator[str]:
    """`senddock web` with single sign-on against a provider started for it."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: apt-get install nodejs npm, then "
                    "(cd harness/oidc && npm ci)")
    if not (HARNESS / "node_modules" / "oidc-provider").is_dir():
        pytest.skip("the OpenID provider harness is not installed: (cd harness/oidc && npm ci)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        provider_port = s.getsockname()[1]
    provider = subprocess.Popen(
        ["node", "server.mjs", str(provider_port)], cwd=HARNESS, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "CLIENT_ID": CLIENT_ID,
             "CLIENT_SECRET": CLIENT_SECRET, "REDIRECT_URI": f"{base}/login/sso/callback"})
    try:
        assert provider.stdout is not None
        line = provider.stdout.readline()
        assert line.startswith("ready "), f"the provider did not start: {line!r}"
        values = settings(db_url, sink.port, BASE_URL=base, OIDC_ISSUER=line.split()[1],
                          OIDC_CLIENT_ID=CLIENT_ID, OIDC_CLIENT_SECRET=CLIENT_SECRET,
                          OIDC_ROLE_MAP="marketing=marketer,senddock-admins=admin",
                          OIDC_CREATE_USERS="on")
        web = spawn(["web", "--port", str(port)], values)
        wait_for(lambda: "listening on" in web.output() or web.popen.poll() is not None,
                 timeout=60, message="web to start")
        assert web.popen.poll() is None, web.output()
        yield base
    finally:
        provider.terminate()
        provider.wait(timeout=10)


@pytest.mark.parametrize("language", ["en", "es"])
def test_sign_in_through_the_identity_provider(browser: Any, served: str, engine: sa.Engine,
                                               language: str) -> None:
    context = browser.new_context(locale="es-ES" if language == "es" else "en-US")
    page = context.new_page()
    page.goto(f"{served}/login")
    with page.expect_navigation():
        page.click("#sso-login")
    login = f"mara-{language}@corp.example#marketing"
    for _ in range(6):  # the provider's sign-in, then its consent page
        if page.url.startswith(served):
            break
        if page.locator("input[name=login]").count():
            page.fill("input[name=login]", login)
            page.fill("input[name=password]", "anything")
        with page.expect_navigation():
            page.locator("button[type=submit]").first.click()
        page.wait_for_load_state("load")
    assert page.url.startswith(served) and "/login" not in page.url, page.url
    badge = {"en": "marketer", "es": "marketing"}[language]
    assert f"mara-{language}@corp.example" in page.inner_text("header")
    assert badge in page.inner_text("header").lower()
    with engine.connect() as conn:
        role = conn.execute(sa.text("SELECT role FROM users WHERE email = :e"),
                            {"e": f"mara-{language}@corp.example"}).scalar()
    assert role == "marketer"
    page.goto(f"{served}/account/")
    assert page.locator("#session-list tbody tr").count() == 1
    with page.expect_navigation():
        page.locator("header form[action$='/logout'] button").click()
    page.goto(f"{served}/account/")
    assert "/login" in page.url
    context.close()
