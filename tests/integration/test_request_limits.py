"""Request size limits as docs/configuration.md prints them, on a real waitress:
SENDDOCK_MAX_REQUEST_BYTES everywhere but the CSV import, with a JSON 413 on the API;
SENDDOCK_MAX_IMPORT_BYTES, larger, reachable by the import form (and only by it)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from tests.conftest import free_port, settings, wait_for
from webapp.domain import lists

REQUEST_LIMIT, IMPORT_LIMIT = 20_000, 400_000
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture()
def server(db_url: str, sink: Any, spawn: Callable[..., Any]) -> str:
    port = free_port()
    proc = spawn(["web", "--port", str(port)], settings(
        db_url, sink.port, WORKERS="0", MAX_REQUEST_BYTES=str(REQUEST_LIMIT),
        MAX_IMPORT_BYTES=str(IMPORT_LIMIT)))
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.popen.poll() is None, proc.output()
        try:
            return requests.get(f"{base}/healthz", timeout=2).ok
        except requests.ConnectionError:
            return False

    wait_for(up, timeout=30, message="senddock web")
    return base


def _csv(size: int) -> bytes:
    rows, i = [b"email,name"], 0
    while sum(len(r) + 1 for r in rows) < size:
        rows.append(f"person{i}@example.org,Person {i}".encode())
        i += 1
    return b"\n".join(rows) + b"\n"


@pytest.mark.slow
def test_limits_per_endpoint_on_a_real_server(
        server: str, engine: sa.Engine, make_user: Callable[..., dict[str, Any]],
        tmp_path: Path) -> None:
    user = make_user("marketer")
    bearer = {"Authorization": f"Bearer {user['token']}"}
    big_json = {"name": "x" * (REQUEST_LIMIT + 10)}
    answer = requests.post(f"{server}/api/v1/lists", json=big_json, headers=bearer, timeout=10)
    assert answer.status_code == 413
    assert answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["error"]["message"]
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Big import", actor="tests")["id"]
    browser = requests.Session()
    token = CSRF.search(browser.get(f"{server}/login", timeout=10).text)[1]  # type: ignore[index]
    assert browser.post(f"{server}/login", data={
        "csrf_token": token, "email": user["email"], "password": user["password"]},
        timeout=10, allow_redirects=False).status_code == 302
    page = browser.get(f"{server}/lists/{list_id}/import", timeout=10).text
    token = CSRF.search(page)[1]  # type: ignore[index]
    # A CSV over the request limit but under the import limit is imported.
    fits = _csv(REQUEST_LIMIT * 5)
    answer = browser.post(f"{server}/lists/{list_id}/import", data={"csrf_token": token},
                          files={"file": ("fits.csv", fits, "text/csv")}, timeout=60)
    assert answer.status_code == 200, answer.text[:500]
    with engine.connect() as conn:
        imported = conn.execute(sa.text("SELECT count(*) FROM memberships WHERE list_id = :l"),
                                {"l": list_id}).scalar_one()
    assert imported == fits.count(b"\n") - 1
    # Over the import limit: refused.
    too_big = _csv(IMPORT_LIMIT + 10_000)
    answer = browser.post(f"{server}/lists/{list_id}/import", data={"csrf_token": token},
                          files={"file": ("big.csv", too_big, "text/csv")}, timeout=60)
    assert answer.status_code == 413
    # The import's limit is for the import only: another form over the request limit is 413.
    answer = browser.post(f"{server}/lists/", data={"csrf_token": token,
                                                    "name": "y" * (REQUEST_LIMIT + 10)},
                          timeout=10)
    assert answer.status_code == 413
