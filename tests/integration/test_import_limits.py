"""The CSV import's size limit and the cleanup of checked files (docs/design.md §35): a file
over SENDDOCK_MAX_IMPORT_BYTES is refused before any of it is read into the database, with
a 413 that names the limit and its setting, whether it is checked first or imported; a
file checked first but never imported is deleted by the engine's maintenance once it
expires. The limit is lowered by the setting, so the files stay small."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser
from webapp import create_app
from webapp.domain import lists
from workers.core import pg
from workers.core.settings import Config
from workers.delivery.maintenance import Maintenance

LIMIT = 64 * 1024  # bytes: the test's SENDDOCK_MAX_IMPORT_BYTES


def _csv(rows: int) -> bytes:
    return ("email,name\n" + "".join(f"p{i:06d}@example.org,Person {i}\n"
                                     for i in range(rows))).encode()


def _counts(engine: sa.Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
                     for table in ("import_uploads", "import_upload_chunks", "subscribers"))


def _marketer(engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
              make_user: Callable[..., dict[str, Any]]) -> tuple[Any, Browser, int]:
    """A client of an app with the test's import limit, a marketer logged in, and a list."""
    app = create_app(config_for(sink.port, MAX_IMPORT_BYTES=str(LIMIT)), engine=engine)
    app.config["TESTING"] = True
    client = app.test_client()
    browser = Browser(client, make_user("marketer"))
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Imported")["id"])
    return client, browser, list_id


def _upload(client: Any, browser: Browser, list_id: int, data: bytes, action: str) -> Any:
    return client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": action,
        "file": (io.BytesIO(data), "people.csv")}, content_type="multipart/form-data")


def test_a_file_over_the_limit_is_refused_naming_the_limit_and_nothing_is_kept(
        engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    client, browser, list_id = _marketer(engine, config_for, sink, make_user)
    over = _csv(2500)
    assert len(over) > LIMIT
    before = _counts(engine)
    for action in ("check", "import"):
        r = _upload(client, browser, list_id, over, action)
        page = r.get_data(as_text=True)
        assert r.status_code == 413, page
        assert "64 KiB" in page and "SENDDOCK_MAX_IMPORT_BYTES" in page, page
        assert 'name="file"' in page  # back on the upload form, to choose a smaller file
        assert _counts(engine) == before  # nothing kept, nothing imported
    # The same page in Spanish.
    client.post("/account/language", data={"csrf_token": browser.token, "locale": "es"})
    page = _upload(client, browser, list_id, over, "check").get_data(as_text=True)
    assert "64 KiB" in page and "límite" in page, page
    # The form states the limit before anyone uploads.
    form = client.get(f"/lists/{list_id}/import").get_data(as_text=True)
    assert 'id="import-limit">Archivos de hasta 64 KiB' in form, form
    # Its example file shows its three lines (it showed them run together on one line).
    assert "email,name,plan\nada@example.com,Ada Lovelace,pro\ngrace@" in form, form
    # Under the limit the file is checked and kept as before.
    under = _csv(1000)
    assert len(under) < LIMIT
    r = _upload(client, browser, list_id, under, "check")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert _counts(engine)[0] == 1


def test_maintenance_deletes_checked_files_that_expired(
        engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    client, browser, list_id = _marketer(engine, config_for, sink, make_user)
    with engine.begin() as conn:  # one kept file per user and list: three lists
        others = [int(lists.create_list(conn, f"Imported {n}")["id"]) for n in (2, 3)]
    for each in (list_id, *others):
        assert _upload(client, browser, each, _csv(500), "check").status_code == 200
    with engine.begin() as conn:  # two were checked more than an hour ago, never imported
        conn.execute(sa.text("""
            UPDATE import_uploads SET expires_at = now() - interval '1 s'
             WHERE token IN (SELECT token FROM import_uploads ORDER BY created_at LIMIT 2)"""))
    assert _counts(engine)[:2][0] == 3
    maintenance = Maintenance(engine, pg.Outage("test", logging.getLogger("test")),
                              threading.Event())
    maintenance.run()
    kept, chunks, _ = _counts(engine)
    assert kept == 1 and chunks >= 1  # the unexpired one stays, with its file
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM import_upload_chunks c WHERE NOT EXISTS "
            "(SELECT 1 FROM import_uploads u WHERE u.token = c.token)")).scalar_one() == 0
