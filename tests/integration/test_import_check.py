"""Checking a CSV file first (the import's dry run, docs/design.md §35): the check writes no
subscriber row, not even one rolled back (a rolled-back insert still leaves a dead row and
a table that grows); a user keeps at most one checked file per list, replaced by the next
check and deleted after the import, on "Choose another file" and when it cannot be read;
another user's file is left alone; a file over SENDDOCK_MAX_IMPORT_BYTES is refused with a
413 naming the limit before the view does any work, whether the request states its length
or streams it."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from webapp import create_app
from webapp.domain import import_uploads, lists
from workers.core.settings import Config

LIMIT = 64 * 1024  # bytes: the oversize test's SENDDOCK_MAX_IMPORT_BYTES


def _csv(rows: int, *, start: int = 0) -> bytes:
    return ("email,name\n" + "".join(f"p{i:06d}@example.org,Person {i}\n"
                                     for i in range(start, start + rows))).encode()


def _new_list(engine: sa.Engine, name: str = "Imported") -> int:
    with engine.begin() as conn:
        return int(lists.create_list(conn, name)["id"])


def _check(browser: Browser, list_id: int, data: bytes) -> Any:
    return browser.client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": "check",
        "file": (io.BytesIO(data), "people.csv")}, content_type="multipart/form-data")


def _action(page: Any) -> str:
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "Dry run: nothing was saved" in text, text[:2000]
    return str(re.search(r'action="(/lists/\d+/import/[^"]+)"', text)[1])


def _uploads(engine: sa.Engine) -> list[tuple[int, int, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT owner_id, list_id, token FROM import_uploads ORDER BY owner_id, list_id"))]


def _orphan_chunks(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM import_upload_chunks c WHERE NOT EXISTS "
            "(SELECT 1 FROM import_uploads u WHERE u.token = c.token)")).scalar_one())


def _inserted_into_subscribers(engine: sa.Engine) -> int:
    """pg_stat_user_tables.n_tup_ins for subscribers once every other session of the test's
    database has ended (a backend reports its counts when it exits): counts every insert,
    committed or rolled back."""
    engine.dispose()
    with engine.connect() as conn:
        deadline = time.monotonic() + 20
        while conn.execute(sa.text("""
                SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'""")).scalar_one():
            assert time.monotonic() < deadline, "other sessions did not end"
            time.sleep(0.05)
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(sa.text(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'subscribers'"))
            .scalar_one())


def test_a_check_writes_no_subscriber_row_and_reports_what_the_import_would_do(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _new_list(engine)
    with engine.begin() as conn:  # two addresses already stored (one on another list)
        other = int(lists.create_list(conn, "Other")["id"])
        lists.add_subscribers(conn, other, [{"email": "P000001@example.org", "name": "Old"}])
        lists.add_subscribers(conn, list_id, [{"email": "p000002@example.org"}])
    browser = Browser(client, make_user("marketer"))
    data = _csv(300) + b"p000003@example.org,again\nnot an address,x\n"
    with engine.connect() as conn:
        sequence = conn.execute(sa.text("SELECT last_value FROM subscribers_id_seq")).scalar()
    inserted = _inserted_into_subscribers(engine)
    page = _check(browser, list_id, data)
    action = _action(page)
    text = page.get_data(as_text=True)
    assert 'id="import-added">298<' in text and 'id="import-updated">2<' in text, text
    assert 'id="import-rejected">2<' in text and 'id="import-lines">302<' in text
    # Nothing written to subscribers: no row, no number drawn, no insert rolled back.
    assert _inserted_into_subscribers(engine) == inserted
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar() == 2
        assert conn.execute(sa.text("SELECT last_value FROM subscribers_id_seq")).scalar() \
            == sequence
        assert conn.execute(sa.text("SELECT count(*) FROM audit_log WHERE action = "
                                    "'list.import'")).scalar() == 0
    # The import does what the check said.
    done = client.post(action, data={"csrf_token": browser.token, "action": "import",
                                     "columns": "2", "role_0": "email", "role_1": "name"})
    report = done.get_data(as_text=True)
    assert 'id="import-added">298<' in report and 'id="import-updated">2<' in report, report
    assert _inserted_into_subscribers(engine) > inserted


def test_one_kept_file_per_user_and_list_and_another_users_is_untouched(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id, other_list = _new_list(engine), _new_list(engine, "Other")
    mine = make_user("marketer")
    me, them = Browser(app.test_client(), mine), Browser(app.test_client(),
                                                         make_user("marketer"))
    _action(_check(them, list_id, _csv(50)))
    _action(_check(me, other_list, _csv(50)))
    first = _action(_check(me, list_id, _csv(2000)))
    second = _action(_check(me, list_id, _csv(2000, start=5000)))
    kept = _uploads(engine)
    assert len(kept) == 3, kept
    mine_here = [token for owner, lst, token in kept if owner == mine["id"] and lst == list_id]
    assert len(mine_here) == 1 and second.endswith("/" + mine_here[0])
    assert {(owner == mine["id"], lst) for owner, lst, _ in kept} == {
        (False, list_id), (True, other_list), (True, list_id)}
    assert _orphan_chunks(engine) == 0  # the replaced file's chunks went with it
    # The replaced check cannot be imported any more.
    gone = me.client.post(first, data={"csrf_token": me.token, "action": "import",
                                       "columns": "2", "role_0": "email"},
                          follow_redirects=True)
    assert "no longer kept" in gone.get_data(as_text=True)
    # Another user cannot import my file, even with its address.
    stolen = them.client.post(second, data={"csrf_token": them.token, "action": "import",
                                            "columns": "2", "role_0": "email"},
                              follow_redirects=True)
    assert "no longer kept" in stolen.get_data(as_text=True)
    assert len(_uploads(engine)) == 3


def test_the_kept_file_is_deleted_after_the_import_on_start_over_and_when_unreadable(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _new_list(engine)
    me, them = Browser(app.test_client(), make_user("marketer")), \
        Browser(app.test_client(), make_user("marketer"))
    _action(_check(them, list_id, _csv(10)))  # stays through all of mine
    action = _action(_check(me, list_id, _csv(100)))
    done = me.client.post(action, data={"csrf_token": me.token, "action": "import",
                                        "columns": "2", "role_0": "email", "role_1": "name"})
    assert 'id="import-added">100<' in done.get_data(as_text=True)
    assert len(_uploads(engine)) == 1  # theirs
    # "Choose another file" starts over: the file is deleted, back on the upload form.
    action = _action(_check(me, list_id, _csv(100)))
    assert len(_uploads(engine)) == 2
    page = me.client.post(action, data={"csrf_token": me.token, "action": "discard"},
                          follow_redirects=True)
    assert page.status_code == 200 and 'name="file"' in page.get_data(as_text=True)
    assert len(_uploads(engine)) == 1
    # A file that turns out unreadable is not kept either.
    bad = _check(me, list_id, b"email\nok@example.org\nbad\xff@example.org\n")
    assert bad.status_code == 422 and "not valid UTF-8" in bad.get_data(as_text=True)
    assert [lst for _, lst, _ in _uploads(engine)] == [list_id] and _orphan_chunks(engine) == 0


@pytest.mark.parametrize("length", ["stated", "streamed"])
def test_a_file_over_the_limit_gets_413_naming_it_before_any_work(
        engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
        make_user: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        length: str) -> None:
    app = create_app(config_for(sink.port, MAX_IMPORT_BYTES=str(LIMIT)), engine=engine)
    app.config["TESTING"] = True
    browser = Browser(app.test_client(), make_user("marketer"))
    list_id = _new_list(engine)

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the view kept a file over the limit")

    monkeypatch.setattr(import_uploads, "keep", no_work)
    boundary = "senddock-test-boundary"
    body = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                   f"{value}\r\n" for name, value in (("csrf_token", browser.token),
                                                     ("action", "check"))).encode() + (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="people.csv"\r\nContent-Type: text/csv\r\n\r\n').encode() + \
        _csv(3000) + f"\r\n--{boundary}--\r\n".encode()
    assert len(body) > LIMIT
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if length == "stated":
        r = browser.client.post(f"/lists/{list_id}/import", data=body, headers=headers)
    else:  # chunked: no Content-Length, the body is counted as it is read
        r = browser.client.post(f"/lists/{list_id}/import", input_stream=io.BytesIO(body),
                                headers={**headers, "Transfer-Encoding": "chunked"},
                                environ_overrides={"wsgi.input_terminated": True})
        assert r.request.content_length is None  # what the server knows: no length
    page = r.get_data(as_text=True)
    assert r.status_code == 413, page[:2000]
    assert "larger than the import" in page and "limit of 64 KiB" in page and \
        "SENDDOCK_MAX_IMPORT_BYTES" in page, page
    assert _uploads(engine) == []
