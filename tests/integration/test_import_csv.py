"""CSV import: a deliberately broken file gets a per-line report and the rest imported;
files that cannot be read as a whole get a clear error and import nothing (P9)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from webapp import create_app, db
from webapp.domain import import_uploads, imports, lists
from webapp.domain.errors import Invalid
from webapp.domain.suppressions import suppress
from workers.core.settings import Config

BROKEN = (
    "\ufeffEmail;Name;Plan;City\r\n"             # 1: BOM, semicolons, mixed-case header
    "ada@example.org;Ada;pro;London\r\n"        # 2
    "not-an-address;Bob;free;Paris\r\n"         # 3 invalid
    "ADA@example.org;Ada again;team;\r\n"       # 4 duplicate of 2 (however cased)
    "\r\n"                                      # 5 blank: ignored
    "blocked@example.org;Blocked;free;Rome\r\n" # 6 suppressed
    ";No address;free;\r\n"                     # 7 missing address
    "\"quoted;semi@example.org\";x;y;z\r\n"     # 8 invalid (quoted cell with the delimiter)
    "grace@example.org;\"Hopper; Grace\";team;\"New\r\nYork\"\r\n"  # 9-10 quoted newline
    "zoë@example.org;Zoë;pro;Zürich\r\n"        # 11 UTF-8 name and address
    "existing@example.org;Updated Name;;\r\n"   # 12 already a subscriber: updated
)


def _import(engine: sa.Engine, list_id: int, data: bytes) -> imports.ImportReport:
    with engine.begin() as conn:
        return imports.import_csv(conn, list_id, io.BytesIO(data), actor="test")


def _setup(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Imported")["id"])
        suppress(conn, "Blocked@Example.org", "manual", actor="test")
        other = lists.create_list(conn, "Other")["id"]
        lists.add_subscribers(conn, other, [{"email": "existing@example.org", "name": "Old"}])
    return list_id


def test_broken_file_reports_each_line_and_imports_the_rest(engine: sa.Engine) -> None:
    list_id = _setup(engine)
    report = _import(engine, list_id, BROKEN.encode("utf-8"))
    rejected = [(r.line, r.reason) for r in report.rejected]
    assert rejected == [(3, "invalid address"), (4, "duplicate"), (6, "suppressed"),
                        (7, "invalid address"), (8, "invalid address")]
    assert [r.detail for r in report.rejected if r.line == 4] == ["same address as line 2"]
    assert (report.added, report.updated, report.lines) == (3, 1, 9)
    with engine.connect() as conn:
        rows = {r.email: r for r in conn.execute(sa.text("""
            SELECT s.email, s.name, s.attributes FROM memberships m
              JOIN subscribers s ON s.id = m.subscriber_id WHERE m.list_id = :l"""),
            {"l": list_id})}
        assert lists.get_list(conn, list_id)["subscribers"] == 4
    assert set(rows) == {"ada@example.org", "grace@example.org", "zoë@example.org",
                         "existing@example.org"}
    assert rows["grace@example.org"].name == "Hopper; Grace"
    assert rows["grace@example.org"].attributes == {"Plan": "team", "City": "New\r\nYork"}
    assert rows["zoë@example.org"].attributes == {"Plan": "pro", "City": "Zürich"}
    assert rows["existing@example.org"].name == "Updated Name"
    assert rows["ada@example.org"].attributes == {"Plan": "pro", "City": "London"}


def test_duplicates_across_batches_name_the_first_line(engine: sa.Engine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "BATCH", 3)
    list_id = _setup(engine)
    lines = ["email,name"] + [f"u{i}@example.org,U{i}" for i in range(10)] + ["U2@example.org,"]
    report = _import(engine, list_id, "\n".join(lines).encode())
    assert [(r.line, r.reason, r.detail) for r in report.rejected] == [
        (12, "duplicate", "same address as line 4")]
    assert report.added == 10


def test_missing_email_column_is_a_clear_error(engine: sa.Engine) -> None:
    list_id = _setup(engine)
    with pytest.raises(Invalid, match="“email” column; found “address”, “name”"):
        _import(engine, list_id, b"address,name\nada@example.org,Ada\n")
    with pytest.raises(Invalid, match="empty"):
        _import(engine, list_id, b"")


def test_non_utf8_bytes_name_the_line_and_import_nothing(engine: sa.Engine,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(imports, "BATCH", 2)  # earlier batches were written: rolled back
    list_id = _setup(engine)
    data = b"email,name\na@example.org,A\nb@example.org,B\nc@example.org,C\n" + \
        "d@example.org,Jos\u00e9\n".encode("latin-1")
    with pytest.raises(Invalid, match=r"line 5 is not valid UTF-8 \(byte 0xE9"):
        _import(engine, list_id, data)
    with engine.connect() as conn:
        assert lists.get_list(conn, list_id)["subscribers"] == 0
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar() == 1


def test_upload_through_the_page(client: Any, engine: sa.Engine,
                                 make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _setup(engine)
    browser = Browser(client, make_user("marketer"))
    page = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token,
        "file": (io.BytesIO(BROKEN.encode("utf-8")), "people.csv")},
        content_type="multipart/form-data")
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text
    assert 'id="import-added">3<' in text and 'id="import-rejected">5<' in text
    assert "same address as line 2" in text and "not-an-address" in text
    bad = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token,
        "file": (io.BytesIO(b"who,what\n<b>x</b>,y\n"), "bad.csv")},
        content_type="multipart/form-data")
    assert bad.status_code == 422
    assert "“email” column" in bad.get_data(as_text=True)
    none = client.post(f"/lists/{list_id}/import", data={"csrf_token": browser.token},
                       content_type="multipart/form-data")
    assert none.status_code == 422 and "Choose a CSV file" in none.get_data(as_text=True)


def test_check_first_is_a_dry_run_with_column_mapping_and_shape_report(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _setup(engine)
    browser = Browser(client, make_user("marketer"))
    data = ("Mail,Full name,City,junk\n"
            "ann@example.org,Ann,Lyon,x\n"
            "bob@example.org,Bob,Paris,y,EXTRA\n"  # one field too many
            "cy@example.org,Cy\n")  # City and junk missing
    page = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": "check",
        "file": (io.BytesIO(data.encode()), "people.csv")},
        content_type="multipart/form-data")
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text
    assert "Dry run: nothing was saved" in text and 'id="import-added">3<' in text
    assert ("1 line has more fields than the header's 4 columns; the extra values would "
            "not be imported") in text and "line 3" in text  # not "were would not be"
    assert "1 line had fewer fields" in text and "“City” (1)" in text
    spanish = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": "check",
        "file": (io.BytesIO(data.encode()), "people.csv")},
        content_type="multipart/form-data", headers={"Accept-Language": "es"}
    ).get_data(as_text=True)
    assert "1 línea tiene más campos que las 4 columnas de la cabecera" in spanish
    assert "1 línea tenía menos campos" in spanish and "tenían" not in spanish
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM audit_log WHERE action = "
                                    "'list.import'")).scalar() == 0
    # The second check (in Spanish) is the upload the import goes on with.
    action = re.search(r'action="(/lists/\d+/import/[^"]+)"', spanish)[1]
    roles = re.findall(r'<option value="(\w+)" selected>', text)
    assert roles == ["email", "name", "attribute", "attribute"]
    done = client.post(action, data={"csrf_token": browser.token, "action": "import",
                                     "columns": "4", "role_0": "email", "role_1": "name",
                                     "role_2": "attribute", "role_3": "skip"})
    report = done.get_data(as_text=True)
    assert 'id="import-added">3<' in report and "Dry run" not in report
    with engine.connect() as conn:
        attrs = dict(conn.execute(sa.text(
            "SELECT email, attributes FROM subscribers WHERE email <> 'existing@example.org'"
        )).all())
    assert attrs == {"ann@example.org": {"City": "Lyon"}, "bob@example.org": {"City": "Paris"},
                     "cy@example.org": {}}  # junk skipped as mapped
    again = client.post(action, data={"csrf_token": browser.token, "action": "import",
                                      "columns": "4"}, follow_redirects=True)
    assert "no longer kept" in again.get_data(as_text=True)  # used once


def _check(client: Any, browser: Browser, list_id: int, data: bytes) -> str:
    """Upload ``data`` with "Check first"; the form action that imports it."""
    page = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": "check",
        "file": (io.BytesIO(data), "people.csv")}, content_type="multipart/form-data")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "Dry run: nothing was saved" in text, text
    return str(re.search(r'action="(/lists/\d+/import/[^"]+)"', text)[1])


def _second_web_process(first: Any, config_for: Callable[..., Config], sink: Any,
                        db_url: str) -> Any:
    """Another app object with its own engine on the same database (another web host
    behind the load balancer), and a client carrying the first client's cookies."""
    other = create_app(config_for(sink.port), engine=db.make_engine(db_url, pool_size=2))
    other.config["TESTING"] = True
    client = other.test_client()
    for cookie in first._cookies.values():
        client.set_cookie(cookie.key, cookie.value, domain=cookie.domain, path=cookie.path)
    return client


def test_a_file_checked_on_one_web_process_is_imported_through_another(
        client: Any, engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
        db_url: str, make_user: Callable[..., dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks of an odd size: lines cross chunk boundaries and are put back together.
    monkeypatch.setattr(import_uploads, "CHUNK", 997)
    list_id = _setup(engine)
    browser = Browser(client, make_user("marketer"))
    rows = "".join(f"p{i}@example.org,P{i}\n" for i in range(3000))
    action = _check(client, browser, list_id, f"email,name\n{rows}".encode())
    with engine.connect() as conn:  # kept in PostgreSQL, not in this host's temp dir
        assert conn.execute(sa.text("SELECT count(*) FROM import_uploads")).scalar() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM import_upload_chunks")).scalar() \
            > 50
    other = _second_web_process(client, config_for, sink, db_url)
    done = other.post(action, data={"csrf_token": browser.token, "action": "import",
                                    "columns": "2", "role_0": "email", "role_1": "name"})
    report = done.get_data(as_text=True)
    assert done.status_code == 200 and 'id="import-added">3,000<' in report, report
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM memberships WHERE list_id = :l"), {"l": list_id}).scalar() \
            == 3000
        # Imported once: the kept file and its chunks are gone with the import.
        assert conn.execute(sa.text("SELECT count(*) FROM import_uploads")).scalar() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM import_upload_chunks")).scalar() \
            == 0


def test_an_expired_check_says_so_and_imports_nothing(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _setup(engine)
    browser = Browser(client, make_user("marketer"))
    action = _check(client, browser, list_id, b"email\nlate@example.org\n")
    with engine.begin() as conn:  # an hour and a second later
        conn.execute(sa.text("UPDATE import_uploads SET expires_at = now() - interval '1 s'"))
    page = client.post(action, data={"csrf_token": browser.token, "action": "import",
                                     "columns": "1", "role_0": "email"},
                       follow_redirects=True)
    text = page.get_data(as_text=True)
    assert "The checked file is no longer kept" in text and "nothing was imported" in text
    assert "Upload it again" in text and 'name="file"' in text  # back on the upload form
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers WHERE email = "
                                    "'late@example.org'")).scalar() == 0
        # The expired row was cleaned up when it was asked for.
        assert conn.execute(sa.text("SELECT count(*) FROM import_uploads")).scalar() == 0
    # Nothing is lost: the same file checked again imports.
    again = _check(client, browser, list_id, b"email\nlate@example.org\n")
    client.post(again, data={"csrf_token": browser.token, "action": "import",
                             "columns": "1", "role_0": "email"})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers WHERE email = "
                                    "'late@example.org'")).scalar() == 1


UNCLOSED = (b"email,name,city\n"
            b"ada@example.org,\"Ada Lovelace\n"          # 2: the quote is never closed
            b"bob@example.org,Bob,Paris\n"               # 3
            b"cy@example.org,Cy,\"New\nYork\"\n"         # 4-5: a closed quote may span lines
            b"dee@example.org,Dee,Rome\n")               # 6


@pytest.mark.parametrize("action", ["import", "check"])
def test_an_unclosed_quote_refuses_its_line_and_the_lines_after_it_are_read_on_their_own(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]],
        action: str) -> None:
    list_id = _setup(engine)
    browser = Browser(client, make_user("marketer"))
    pages = {lang: client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": action,
        "file": (io.BytesIO(UNCLOSED), "people.csv")}, content_type="multipart/form-data",
        headers={"Accept-Language": lang}) for lang in ("en", "es")}
    text, spanish = (pages[lang].get_data(as_text=True) for lang in ("en", "es"))
    assert pages["en"].status_code == 200, text
    assert 'id="import-added">3<' in text and 'id="import-rejected">1<' in text
    assert "an unclosed quote?" in text and "ada@example.org" in text
    assert re.search(r'<td class="num">2</td><td>ada@example.org</td>', text)
    assert "¿una comilla sin cerrar?" in spanish and "comilla sin cerrar</span>" in spanish
    with engine.connect() as conn:
        names = dict(conn.execute(sa.text("SELECT email, name FROM subscribers")).all())
    if action == "check":
        assert set(names) == {"existing@example.org"}  # a dry run saved nothing
        return
    assert names == {"existing@example.org": "Old", "bob@example.org": "Bob",
                     "cy@example.org": "Cy", "dee@example.org": "Dee"}


def test_an_unclosed_quote_that_reaches_the_field_size_limit_is_refused_alike(
        engine: sa.Engine) -> None:
    """In a large file the runaway quote hits the CSV reader's field size limit before the
    end of the file: the line is refused the same way and the rest read on their own."""
    list_id = _setup(engine)
    body = b"email,name\nada@example.org,\"Ada\n" + b"".join(
        b"u%d@example.org,U%d\n" % (i, i) for i in range(100))
    limit = csv.field_size_limit(200)
    try:
        report = _import(engine, list_id, body)
    finally:
        csv.field_size_limit(limit)
    assert [(r.line, r.reason) for r in report.rejected] == [(2, "unclosed quote")]
    assert report.added == 100


def test_a_tracking_column_is_the_consent_not_an_attribute(engine: sa.Engine) -> None:
    list_id = _setup(engine)
    report = _import(engine, list_id, (
        b"email,name,tracking,plan\nada@example.org,Ada,no,pro\n"
        b"bob@example.org,Bob,yes,\ncy@example.org,Cy,,team\nd@example.org,D,maybe,\n"
        b"existing@example.org,,0,\n"))
    assert [r.line for r in report.rejected] == [5]
    assert "tracking must be yes or no" in str(report.rejected[0].detail)
    with engine.connect() as conn:
        rows = {r.email: r for r in conn.execute(sa.text(
            "SELECT email, tracking, attributes FROM subscribers"))}
    assert rows["ada@example.org"].tracking is False
    assert rows["ada@example.org"].attributes == {"plan": "pro"}
    assert rows["bob@example.org"].tracking is True
    assert rows["cy@example.org"].tracking is True  # blank: the default
    assert rows["existing@example.org"].tracking is False
    assert "d@example.org" not in rows
