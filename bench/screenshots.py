"""A screenshot pass: every page each role reaches from the menu, plus the main detail pages
(a campaign, a list, a subscriber, a job, a sequence, a sending domain), as admin, marketer
and support, in English and Spanish, at 1280 and 390 px, in Chromium, over the demo's data
(``senddock demo`` against a fresh database on the benchmarks' server). Full-page PNGs go to
``--out``; a table says per role, language and width how many pages were seen, which
answered an HTTP error, which are wider than the window (``scrollWidth > innerWidth``),
which have a table cell whose content spills out of it, which say another ``<html lang>``
and which show English on a Spanish page (fragments of the catalogue, as
harness/pages.py reads them, else common English words).

    python -m bench.screenshots [--out /tmp/shots] [--roles admin,support] [--languages es]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from bench.common import ROOT, free_port, fresh_database, table

ROLES = ("admin", "marketer", "support")
LANGUAGES = ("en", "es")
WIDTHS = (1280, 390)
# The main detail pages: the first link of each kind found on the menu's pages (or on a
# detail page found there, e.g. a subscriber on a list's page).
DETAILS = {
    "campaign": re.compile(r"^/campaigns/\d+$"),
    "list": re.compile(r"^/lists/\d+$"),
    "subscriber": re.compile(r"^/lists/\d+/subscribers/\d+$"),
    "job": re.compile(r"^/inbox/\d+$"),
    "sequence": re.compile(r"^/sequences/\d+$"),
    "domain": re.compile(r"^/admin/domains/[^/]+\.[^/]+$"),
    "support user": re.compile(r"^/support/users/[^/]+$"),
}
# Table cells whose content is wider than the cell (a column squeezed until words spill).
CUT_CELLS = """[...document.querySelectorAll('td, th')]
  .filter(c => c.offsetParent !== null && c.scrollWidth > c.clientWidth + 2)
  .map(c => c.textContent.trim().slice(0, 40))"""
SUPPORT_USER = "user-1000"  # seed_more's first user of the app (user-1000 .. user-1002)
WORDS = re.compile(r"\b(?:the|and|with|this|your|have|from|when|which|will|been|there)\b")


@contextmanager
def demo_server(subscribers: int) -> Iterator[tuple[str, str, str]]:
    """``senddock demo`` on a fresh database: (base URL, password, database URL)."""
    with fresh_database() as url, tempfile.TemporaryDirectory() as data_dir:
        port, smtp_port, dns_port = free_port(), free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
        env.update({"SENDDOCK_DATABASE_URL": url, "SENDDOCK_DATA_DIR": data_dir,
                    # Nothing answers there: the domain checks fail fast, never leave the host.
                    "SENDDOCK_DNS_RESOLVER": f"127.0.0.1:{dns_port}",
                    "SENDDOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"})
        log = Path(data_dir) / "demo.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "webapp", "demo", "--port", str(port), "--smtp-port",
                 str(smtp_port), "--subscribers", str(subscribers)],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                deadline = time.monotonic() + 90
                while "listening on" not in log.read_text(errors="replace"):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"demo did not start:\n{log.read_text()}")
                    time.sleep(0.3)
                password = (Path(data_dir) / "demo_password").read_text().strip()
                yield f"http://127.0.0.1:{port}", password, url
            finally:
                proc.terminate()
                proc.wait(30)


def seed_more(url: str) -> None:
    """What the demo lacks for the detail pages: a sequence with steps, and verification
    mail for a user of the app (the support pages)."""
    from webapp.domain import sequences
    from workers import queue
    from workers.core.states import PRIORITY

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        list_id = conn.execute(sa.text("SELECT min(id) FROM lists")).scalar_one()
        sequences.create_sequence(conn, {
            "name": "Welcome series", "trigger_type": "list_add", "list_id": list_id,
            "steps": [{"type": "wait", "wait_seconds": 3600},
                      {"type": "email", "subject": "Welcome, {{ name }}",
                       "text_body": "Hello {{ name }}.\n\n{{ unsubscribe_url }}"}]},
            actor="screenshots")
        for n in range(3):
            queue.enqueue_one(conn, queue.Ask("verification", f"new-user{n}@example.org",
                                              PRIORITY["verification"], {},
                                              user_ref=f"{SUPPORT_USER[:-1]}{n}"), actor=None)
    engine.dispose()


def set_language(url: str, language: str) -> None:
    from webapp.demo import DEMO_USERS

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE users SET locale = :l WHERE email = ANY(:e)"),
                     {"l": language, "e": list(DEMO_USERS)})
    engine.dispose()


def login(page: Any, base: str, email: str, password: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"^(?!.*/login).*$"))


def _same_origin(page: Any, base: str, selector: str) -> list[str]:
    hrefs: list[str] = page.eval_on_selector_all(selector, "els => els.map(e => e.href)")
    out = []
    for href in hrefs:
        parts = urlsplit(href)
        if href.startswith(base) and parts.path not in out:
            out.append(parts.path)
    return out


def pages_of(page: Any, base: str) -> list[tuple[str, str]]:
    """(name, path): the menu's pages, then the first detail page of each kind."""
    page.goto(base + "/")
    menu = [p for p in _same_origin(page, base, "nav a") if "/logout" not in p]
    found: dict[str, str] = {}
    visit = list(menu)
    for path in visit:  # the menu's pages, then the detail pages found on them
        page.goto(base + path)
        for link in _same_origin(page, base, "main a, a"):
            for kind, pattern in DETAILS.items():
                if kind not in found and pattern.match(link):
                    found[kind] = link
                    visit.append(link)
        if len(found) == len(DETAILS):
            break
    if "support user" not in found and any(p.startswith("/support") for p in menu):
        # Verification mail that went out links to its user nowhere in the menu's pages.
        found["support user"] = f"/support/users/{SUPPORT_USER}"
    menu.extend(p for p in found.values() if p not in menu)
    named = [(path.strip("/") or "dashboard", path) for path in dict.fromkeys(menu)]
    return named[:60]


def english_words(html: str) -> list[str]:
    from harness.pages import english_in, visible_text

    found = english_in(html)
    if not found:  # strings outside the catalogue: a cheap count of common English words
        found = sorted(set(WORDS.findall(visible_text(html))))
        found = found if len(found) >= 3 else []
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/shots", type=Path)
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    parser.add_argument("--subscribers", default=300, type=int)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from harness.pages import chromium_path
    from webapp.demo import DEMO_USERS

    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[list[Any]] = []
    details: list[str] = []
    with demo_server(args.subscribers) as (base, password, url), sync_playwright() as p:
        seed_more(url)
        time.sleep(3)  # the small campaign drains into the sink: jobs, a failure, a bounce
        exe = chromium_path()
        browser = p.chromium.launch(executable_path=exe, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        walked: dict[str, list[tuple[str, str]]] = {}
        for language in args.languages.split(","):
            set_language(url, language)
            for role in args.roles.split(","):
                email = next(e for e, r in DEMO_USERS.items() if r == role)
                for width in map(int, args.widths.split(",")):
                    context = browser.new_context(viewport={"width": width, "height": 900},
                                                  locale=language)
                    page = context.new_page()
                    login(page, base, email, password)
                    if role not in walked:
                        walked[role] = pages_of(page, base)
                    errors, wide, lang, english, cut = [], [], [], [], []
                    for name, path in walked[role]:
                        answer = page.goto(base + path)
                        status = answer.status if answer is not None else 0
                        if status >= 400:
                            errors.append(f"{path} {status}")
                        got = page.evaluate("[document.documentElement.scrollWidth, "
                                            "window.innerWidth, document.documentElement.lang]")
                        if got[0] > got[1]:
                            wide.append(f"{path} {got[0]}px")
                        if cells := page.evaluate(CUT_CELLS):
                            cut.append(f"{path}: {cells[:3]}")
                        if got[2] != language:
                            lang.append(f"{path} lang={got[2]!r}")
                        if language != "en" and (words := english_words(page.content())):
                            english.append(f"{path}: {words[:4]}")
                        slug = re.sub(r"[^a-zA-Z0-9]+", "_", name).strip("_")[:70]
                        page.screenshot(path=str(args.out / f"{role}-{language}-{width}-"
                                                 f"{slug}.png"), full_page=True)
                    context.close()
                    rows.append([role, language, width, len(walked[role]), len(errors),
                                 len(wide), len(cut), len(lang), len(english)])
                    for label, items in (("HTTP error", errors), ("overflow", wide),
                                         ("cut cell", cut), ("lang", lang),
                                         ("English", english)):
                        details.extend(f"{role} {language} {width} {label}: {item}"
                                       for item in items)
        browser.close()
    print(table(f"Screenshots in {args.out}",
                ["role", "language", "width", "pages", "HTTP errors", "overflow", "cut cells",
                 "<html lang> differs", "English on page"], rows))
    print("\n".join(details))


if __name__ == "__main__":
    main()
