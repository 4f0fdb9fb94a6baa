"""HEAD never writes: every route in ``app.url_map`` is asked with HEAD, as an
admin, carrying a form body and then a multipart CSV upload, with no CSRF token; the
database is the same afterwards, row for row, and nothing answers 5xx. A HEAD answers
as the GET would, without a body.

Routes are discovered from the url map, so a route added tomorrow is walked too.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.security_fixtures import login, seed
from webapp.security import SAFE_METHODS

# What a write path would read: every field a form of the app takes, with values that
# would pass its checks (so a HEAD reaching a save would save).
FORM = {"name": "Made by HEAD", "subject": "Changed by HEAD", "from": "head@example.org",
        "text": "Hello {{ name }}", "html": "<p>Hello</p>", "email": "head@example.org",
        "password": "head password 123", "status": "active", "attributes": "",
        "role": "admin", "note": "head", "action": "import", "list_id": "1",
        "reason": "manual", "value": "head"}
CSV = b"email,name\nhead-import@example.org,Head Import\n"


def snapshot(engine: sa.Engine) -> dict[str, tuple[int, str]]:
    """Every table's row count and a checksum of all its rows."""
    with engine.connect() as conn:
        tables = conn.execute(sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        ).scalars().all()
        found = {}
        for table in tables:
            quoted = conn.dialect.identifier_preparer.quote(table)
            row = conn.execute(sa.text(
                f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text),"
                f" '')) FROM {quoted} t")).one()
            found[table] = (int(row[0]), str(row[1]))
    return found


def _urls(app: Any, ids: dict[str, Any]) -> list[str]:
    from tests.integration.security_fixtures import _value

    urls = []
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint)):
        values = {name: _value(rule, name, ids, True) for name in rule.arguments}
        built = rule.build(values, append_unknown=False)
        assert built is not None
        urls.append(built[1])
    return urls


@pytest.fixture()
def ids(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


def test_head_with_a_body_changes_nothing_on_any_route(
        app: Any, engine: sa.Engine, ids: dict[str, Any],
        make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    login(client, make_user("admin"))
    urls = _urls(app, ids)
    assert len(urls) > 50
    before = snapshot(engine)
    failures = []
    for url in urls:
        for body in ("form", "multipart"):
            if body == "form":
                answer = client.open(url, method="HEAD", data=FORM)
            else:
                answer = client.open(url, method="HEAD", data={
                    **FORM, "file": (io.BytesIO(CSV), "people.csv")},
                    content_type="multipart/form-data")
            if answer.status_code >= 500:
                failures.append(f"HEAD {url} ({body}): {answer.status_code}")
            if answer.get_data():
                failures.append(f"HEAD {url} ({body}) sent a body")
    assert failures == []
    after = snapshot(engine)
    changed = {table: (before[table], after.get(table)) for table in before
               if before[table] != after.get(table)}
    assert changed == {}


def test_head_answers_as_get_would(app: Any, ids: dict[str, Any],
                                   make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    login(client, make_user("admin"))
    url = f"/campaigns/{ids['campaign_id']}"
    got, head = client.get(url), client.head(url)
    assert head.status_code == got.status_code == 200
    assert head.get_data() == b""
    assert head.headers["Content-Type"] == got.headers["Content-Type"]


@pytest.mark.parametrize("path", ["/campaigns/new", "/lists/{list_id}/import",
                                  "/campaigns/{campaign_id}/edit"])
def test_the_scanned_writes_are_refused(app: Any, engine: sa.Engine, ids: dict[str, Any],
                                        make_user: Callable[..., dict[str, Any]],
                                        path: str) -> None:
    """The outside scan's cases, one by one: each wrote before."""
    client = app.test_client()
    login(client, make_user("admin"))
    with engine.begin() as conn:  # a draft, so an edit would be allowed
        conn.execute(sa.text("UPDATE campaigns SET status = 'draft' WHERE id = :c"),
                     {"c": ids["campaign_id"]})
    before = snapshot(engine)
    url = path.format(**ids)
    answer = client.open(url, method="HEAD", data={
        **FORM, "list_id": str(ids["list_id"]), "file": (io.BytesIO(CSV), "people.csv")},
        content_type="multipart/form-data")
    assert answer.status_code < 500
    assert snapshot(engine) == before


def test_head_login_with_a_password_does_not_log_in(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("admin")
    client = app.test_client()
    before = snapshot(engine)
    answer = client.open("/login", method="HEAD",
                         data={"email": user["email"], "password": user["password"]})
    assert answer.status_code == 200
    assert snapshot(engine) == before
    assert client.get("/").status_code in (302, 303)  # still anonymous: sent to log in
    assert client.get("/api/v1/lists").status_code == 401


def test_csrf_covers_every_unsafe_method(app: Any) -> None:
    methods = app.config["WTF_CSRF_METHODS"]
    for method in ("POST", "PUT", "PATCH", "DELETE", "PROPFIND", "LOCK"):
        assert method in methods
    for method in SAFE_METHODS:
        assert method not in methods
