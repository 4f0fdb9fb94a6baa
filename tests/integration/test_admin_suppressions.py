"""The suppression list: keyset paging, search, paste many, clear with a note (audited),
cleared addresses reached by the next campaign, the page and the API."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser, make_campaign
from webapp.domain import audit, suppressions
from webapp.domain.errors import Invalid
from workers import queue


def seed(engine: sa.Engine, n: int) -> None:
    """n entries; groups of 7 share a timestamp, so the keyset's tie-break matters."""
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO suppressions (email, reason, created_at)
            SELECT 'user' || i || '@example.org',
                   (ARRAY['bounced', 'unsubscribed', 'complaint', 'manual'])[1 + i % 4],
                   timestamptz '2026-01-01' + (i / 7) * interval '1 minute'
              FROM generate_series(1, :n) i"""), {"n": n})


def walk(engine: sa.Engine, **kw: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = None
    with engine.connect() as conn:
        while True:
            page = suppressions.search(conn, after=after, limit=20, **kw)
            rows += page.rows
            if page.next_cursor is None:
                return rows
            after = page.next_cursor


def test_keyset_pages_return_every_entry_once_in_order(engine: sa.Engine) -> None:
    seed(engine, 130)
    rows = walk(engine)
    assert len(rows) == 130 and len({r["email"] for r in rows}) == 130
    keys = [(r["created_at"], r["email"]) for r in rows]
    assert keys == sorted(keys, reverse=True)

    bounced = walk(engine, reason="bounced")
    assert {r["reason"] for r in bounced} == {"bounced"} and len(bounced) == 32

    found = walk(engine, query="USER1")  # user1, user10..19, user100..130
    assert [r["email"] for r in found] == sorted(
        f"user{i}@example.org" for i in range(1, 131) if str(i).startswith("1"))
    assert walk(engine, query="user12@", reason="manual") == []
    assert [r["email"] for r in walk(engine, query="user12@")] == ["user12@example.org"]


def test_a_broken_cursor_is_a_clear_error(engine: sa.Engine) -> None:
    with engine.connect() as conn, pytest.raises(Invalid, match="page link is broken"):
        suppressions.search(conn, after="t|not-a-time|x")


def test_add_many_saves_the_good_lines_and_reports_the_bad(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        suppressions.suppress(conn, "Old@Example.org", "complaint", actor="tester")
        report = suppressions.add_many(
            conn, "a@example.org, B@Example.org\nnot-an-address\nold@example.org\n\n"
                  "c@example.org;nope@", reason="manual", note="from the CRM", actor="admin@x")
    assert report["added"] == ["a@example.org", "b@example.org", "c@example.org"]
    assert report["already"] == ["old@example.org"]
    assert [(e["line"], e["value"]) for e in report["errors"]] == [
        (2, "not-an-address"), (5, "c@example.org;nope@")]  # the line, as typed
    with engine.connect() as conn:
        assert suppressions.get(conn, "OLD@example.org")["reason"] == "complaint"  # type: ignore[index]
        logged = audit.entries(conn, action="suppression.add")
    assert sorted(e["target"] for e in logged) == [
        "a@example.org", "b@example.org", "c@example.org", "old@example.org"]
    assert all(e["details"]["note"] == "from the CRM" for e in logged
               if e["target"] != "old@example.org")


def test_cleared_address_is_included_by_the_next_campaign(engine: sa.Engine) -> None:
    emails = ["keep@example.org", "bounced@example.org", "left@example.org"]
    with engine.begin() as conn:
        suppressions.suppress(conn, "bounced@example.org", "bounced", reply="550 5.1.1 gone",
                              actor="system")
        suppressions.suppress(conn, "left@example.org", "unsubscribed", actor="system")
        conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                             "WHERE email = 'left@example.org'"))
    first = make_campaign(engine, emails, name="Before")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                             "WHERE email = 'left@example.org'"))
        queue.enqueue_broadcast(conn, first["broadcast_id"])
        cleared = suppressions.clear(conn, ["Bounced@Example.org", "left@example.org",
                                            "never@example.org"], "mailbox fixed", "admin@x")
    assert cleared == ["bounced@example.org", "left@example.org"]
    second = make_campaign(engine, emails, name="After")
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, second["broadcast_id"])
        jobs = {c: set(conn.execute(sa.text(
            "SELECT email FROM delivery_jobs WHERE campaign_id = :c"), {"c": c}).scalars())
            for c in (first["id"], second["id"])}
        logged = audit.entries(conn, action="suppression.clear")
    assert jobs[first["id"]] == {"keep@example.org"}
    assert jobs[second["id"]] == set(emails)
    assert {(e["target"], e["details"]["note"], e["details"]["reason"]) for e in logged} == {
        ("bounced@example.org", "mailbox fixed", "bounced"),
        ("left@example.org", "mailbox fixed", "unsubscribed")}


def test_page_shows_the_cause_escaped_and_clears_with_a_note(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        job_id = conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, last_error)
            VALUES ('verification', 0, 'bounced', 'evil@example.org', 'x') RETURNING id""")
        ).scalar_one()
        suppressions.suppress(conn, "evil@example.org", "bounced", job_id=job_id,
                              reply="550 5.1.1 <script>alert(1)</script>", actor="system")
    browser = Browser(client, make_user("admin"))
    html = browser.get("/admin/suppressions?q=evil").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert f"/inbox/{job_id}" in html

    refused = browser.post("/admin/suppressions/clear", {"only": "evil@example.org",
                                                         "note": " "})
    assert "Say why in the note" in refused.get_data(as_text=True)
    with engine.connect() as conn:
        assert suppressions.get(conn, "evil@example.org") is not None

    done = browser.post("/admin/suppressions/clear", {"email": ["evil@example.org"],
                                                      "note": "customer fixed it"})
    assert "Cleared evil@example.org" in done.get_data(as_text=True)
    audit_page = browser.get("/admin/audit?target=evil@example.org").get_data(as_text=True)
    assert "suppression.clear" in audit_page and "customer fixed it" in audit_page


def test_paste_form_keeps_the_rejected_lines(client: Any, engine: sa.Engine,
                                            make_user: Callable[..., dict[str, Any]]) -> None:
    browser = Browser(client, make_user("admin"))
    html = browser.post("/admin/suppressions/add", {
        "emails": "ok1@example.org\nbroken line\nok2@example.org", "reason": "manual",
        "note": "list cleanup"}).get_data(as_text=True)
    assert "line 2" in html and ">broken line</textarea>" in html
    with engine.connect() as conn:
        assert suppressions.get(conn, "ok2@example.org")["note"] == "list cleanup"  # type: ignore[index]


def test_a_bad_line_is_one_error_and_goes_back_to_the_box_as_typed(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """"not an email" was three errors (one per word) and came back as three
    lines. One error per bad line, the line kept as typed; a line mixing an address and
    something else names the bad part (the address on it is saved)."""
    browser = Browser(client, make_user("admin"))
    typed = ("a1@example.org, a2@example.org\n"
             "not an email\n"
             "b1@example.org;  oops\n"
             "c1@example.org")
    for lang, expected in (("en", ("line 2", "2 lines could not be read",
                                   "“oops”: invalid email address")),
                           ("es", ("línea 2", "2 líneas no se pudieron leer",
                                   "«oops»: dirección de correo no válida"))):
        html = browser.client.post("/admin/suppressions/add", data={
            "emails": typed, "reason": "manual", "note": "cleanup",
            "csrf_token": browser.token}, headers={"Accept-Language": lang}
        ).get_data(as_text=True)
        assert ">not an email\nb1@example.org;  oops</textarea>" in html, html
        assert len(re.findall(r"<li>[^<]*(?:line|línea) \d+: <code>", html)) == 2
        for text in expected:
            assert text in html, (lang, text)
    with engine.connect() as conn:
        saved = set(conn.execute(sa.text("SELECT email FROM suppressions")).scalars())
    assert saved == {"a1@example.org", "a2@example.org", "b1@example.org", "c1@example.org"}


def test_api(api: Api, client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    created = api.post("/suppressions", {"email": "Api@Example.org", "note": "asked"})
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["email"] == "api@example.org"
    assert api.post("/suppressions", {"email": "api@example.org"}).status_code == 200
    bad = api.post("/suppressions", {"email": "nope", "reason": "manual"})
    assert bad.status_code == 422 and "email" in bad.get_json()["error"]["fields"]
    assert api.post("/suppressions", {"email": "z@example.org",
                                      "reason": "spite"}).status_code == 422
    listed = api.get("/suppressions?email=API@example.org").get_json()
    assert [s["email"] for s in listed["suppressions"]] == ["api@example.org"]
    assert api.get("/suppressions?reason=manual").get_json()["suppressions"][0]["note"] == "asked"
    assert api.get("/suppressions?limit=0").status_code == 422
    assert api.delete("/suppressions/API@example.org").status_code == 204
    assert api.delete("/suppressions/api@example.org").status_code == 404
    marketer = Api(client, make_user("marketer")["token"])
    assert marketer.get("/suppressions").status_code == 403


def test_search_by_domain_or_fragment_exact_counts_and_export(
        client: Any, engine: sa.Engine, make_user: Any) -> None:

    with engine.begin() as conn:
        for email in ("ann@example.net", "bob@example.net", "cy@example.org",
                      "=cmd@example.net"):
            suppressions.suppress(conn, email, "manual", actor="tests")
    browser = Browser(client, make_user("admin"))
    page = browser.get("/admin/suppressions?q=example.net").get_data(as_text=True)
    assert "3 matches “example.net”" in page and "cy@example.org" not in page
    assert "4 entries in all" in page
    assert "1 match “@example.org”" in browser.get(
        "/admin/suppressions?q=%40example.org").get_data(as_text=True)
    assert "ann@example.net" in browser.get("/admin/suppressions?q=nn@ex").get_data(
        as_text=True)
    csv_text = browser.get("/admin/suppressions/export.csv?q=example.net").get_data(
        as_text=True)
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("email,reason,created_at")
    assert sorted(line.split(",")[0] for line in lines[1:]) == [
        "'=cmd@example.net", "ann@example.net", "bob@example.net"]  # neutralised cell
    browser.post("/admin/suppressions/clear", {"only": "ann@example.net", "note": "ok"})
    after = browser.get("/admin/suppressions").get_data(as_text=True)
    assert "3 entries in all" in after  # exact, at once
