"""End-to-end: a live ``senddock serve`` subprocess on a free port, driven by Playwright
in Chromium (Debian's /usr/bin/chromium when present, else Playwright's own)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.pages import chromium_path
from tests.conftest import Proc, free_port, settings, wait_for

ARTIFACTS = Path(__file__).resolve().parent.parent.parent / "test-artifacts"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        exe = chromium_path()
        args = ["--no-sandbox", "--disable-background-networking", "--disable-gpu",
                "--disable-component-update", "--disable-sync", "--no-first-run"]
        b = p.chromium.launch(executable_path=exe, args=args, headless=True) if exe \
            else p.chromium.launch(args=args, headless=True)
        yield b
        b.close()


class LiveServer:
    def __init__(self, proc: Proc, url: str, values: dict[str, str]) -> None:
        self.proc = proc
        self.url = url
        self.settings = values


@pytest.fixture()
def live_server(db_url: str, sink: Any, spawn: Callable[..., Proc]) -> LiveServer:
    """``senddock serve`` (UI + API + pool) against this test's database and sink."""
    port = free_port()
    values = settings(db_url, sink.port, BASE_URL=f"http://127.0.0.1:{port}",
                      RETRY_SCHEDULE_BROADCAST="1,1", RESEND_COOLDOWN="5")
    proc = spawn(["serve", "--port", str(port)], values)
    wait_for(lambda: "listening on" in proc.output() or proc.popen.poll() is not None,
             timeout=60, message="server start")
    assert proc.popen.poll() is None, proc.output()
    return LiveServer(proc, f"http://127.0.0.1:{port}", values)


@pytest.fixture()
def page(browser: Any, request: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    ARTIFACTS.mkdir(exist_ok=True)
    name = re.sub(r"[^a-zA-Z0-9_]+", "_", request.node.name)
    try:
        pg.screenshot(path=str(ARTIFACTS / f"{name}-last.png"), full_page=True)
    except Exception:  # a failed screenshot must not hide the test's result
        pass
    context.close()
    csp = [e for e in errors if "Content Security Policy" in e]
    assert not csp, f"CSP violations: {csp}"


def login(page: Any, server: LiveServer, user: dict[str, Any]) -> None:
    page.goto(f"{server.url}/login")
    page.fill("input[name=email]", user["email"])
    page.fill("input[name=password]", user["password"])
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"^(?!.*/login).*$"))


def demo_user(engine: Any, role: str, language: str, password: str,
              subscribers: int = 50) -> str:
    """The demo's data (webapp.demo.seed) and the address of its user of ``role``, who
    reads the UI in ``language``."""
    from webapp import demo
    from webapp.domain import users
    from webapp.i18n import LANGUAGES

    with engine.begin() as conn:
        demo.seed(conn, subscribers, password)
        email = next(e for e, r in demo.DEMO_USERS.items() if r == role)
        found = users.find_user(conn, email)
        assert found is not None
        users.set_locale(conn, int(found["id"]), language, allowed=LANGUAGES, actor="test")
    return email
