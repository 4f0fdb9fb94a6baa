"""Bounded stored text: every free-text field has one documented limit
(``webapp/domain/text_limits.py``), refused the same way through the API (422 naming the
field; 413 for a body over the request limit), the CSV import (the row's error names the
field, nothing of it written) and the forms (the message in English and Spanish); the
table in docs/security.md is the module's."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser
from webapp.domain import imports, lists, text_limits
from webapp.domain import suppressions as suppression_list

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _list(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return int(lists.create_list(conn, "Limits")["id"])


def _subscribers(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT email, name, attributes FROM subscribers ORDER BY email")).all())


def test_the_docs_table_is_the_modules() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert text_limits.rewrite_docs(text) == text, "run python -m webapp.access_docs"
    for limit in text_limits.LIMITS:
        assert f"| {limit.field} | {limit.chars:,} |" in text


def test_api_suppression_note(api: Any, engine: sa.Engine) -> None:
    over = api.post("/suppressions", json={"email": "a@example.org",
                                           "note": "n" * (text_limits.SUPPRESSION_NOTE + 1)})
    assert over.status_code == 422, over.get_json()
    assert "note" in over.get_json()["error"]["fields"]
    huge = api.post("/suppressions", json={"email": "a@example.org", "note": "n" * 9_000_000})
    assert huge.status_code == 422 and "note" in huge.get_json()["error"]["fields"]
    with engine.connect() as conn:
        assert suppression_list.get(conn, "a@example.org") is None
    at = api.post("/suppressions", json={"email": "a@example.org",
                                         "note": "n" * text_limits.SUPPRESSION_NOTE})
    assert at.status_code == 201


def test_api_body_over_the_request_limit_is_413(api: Any) -> None:
    answer = api.post("/suppressions", data=json.dumps(
        {"email": "b@example.org", "note": "n" * (11 * 1024 * 1024)}),
        content_type="application/json")
    assert answer.status_code == 413


def test_api_campaign_fields(api: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    base = {"name": "ok", "list_id": list_id, "subject": "Hi", "text": "Hello"}
    for field, limit in (("name", text_limits.CAMPAIGN_NAME),
                         ("subject", text_limits.SUBJECT)):
        answer = api.post("/campaigns", json={**base, field: "x" * (limit + 1)})
        assert answer.status_code == 422, (field, answer.get_json())
        assert field in answer.get_json()["error"]["fields"]
    long_from = "N" * text_limits.FROM + " <from@example.org>"
    answer = api.post("/campaigns", json={**base, "from": long_from})
    assert answer.status_code == 422 and "from" in answer.get_json()["error"]["fields"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 0
    assert api.post("/campaigns", json={**base, "name": "x" * text_limits.CAMPAIGN_NAME}
                    ).status_code == 201


def test_api_subscriber_attributes(api: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    answer = api.post(f"/lists/{list_id}/subscribers", json={"subscribers": [
        {"email": "value@example.org",
         "attributes": {"bio": "v" * (text_limits.ATTRIBUTE_VALUE + 1)}},
        {"email": "key@example.org", "attributes": {"k" * 1_000_000: "x"}},
        {"email": "total@example.org", "attributes": {
            f"a{i}": "t" * text_limits.ATTRIBUTE_VALUE for i in range(10)}},
        {"email": "name@example.org", "name": "n" * (text_limits.SUBSCRIBER_NAME + 1)},
        {"email": "fine@example.org", "attributes": {
            "bio": "v" * text_limits.ATTRIBUTE_VALUE, "list": [1, 2]}}]})
    assert answer.status_code == 200
    result = answer.get_json()
    assert result["added"] == 1
    fields = {e["email"]: e["field"] for e in result["errors"]}
    assert fields == {"value@example.org": "attributes.bio", "key@example.org": "attributes",
                      "total@example.org": "attributes", "name@example.org": "name"}
    for error in result["errors"]:
        assert error["field"].split(".")[0] in error["error"] or "attribute" in error["error"]
    assert [r.email for r in _subscribers(engine)] == ["fine@example.org"]


def test_csv_import_rows_name_the_field_and_write_nothing_of_them(engine: sa.Engine) -> None:
    list_id = _list(engine)
    long_value = "v" * (text_limits.ATTRIBUTE_VALUE + 1)
    long_name = "n" * (text_limits.SUBSCRIBER_NAME + 1)
    data = (f"email,name,bio\nok@example.org,Ok,short\nbio@example.org,Bio,{long_value}\n"
            f"name@example.org,{long_name},x\n").encode()
    with engine.begin() as conn:
        report = imports.import_csv(conn, list_id, io.BytesIO(data), actor="test")
    assert report.added == 1
    details = {r.email: str(r.detail) for r in report.rejected}
    assert set(details) == {"bio@example.org", "name@example.org"}
    assert "attributes.bio" in details["bio@example.org"]
    assert "name" in details["name@example.org"]
    assert [r.email for r in _subscribers(engine)] == ["ok@example.org"]
    header = ("email," + "h" * (text_limits.ATTRIBUTE_NAME + 1) + "\nx@example.org,1\n").encode()
    try:
        with engine.begin() as conn:
            imports.import_csv(conn, list_id, io.BytesIO(header), actor="test")
    except imports.Invalid as exc:
        assert "column 2" in str(exc.message)
    else:
        raise AssertionError("an over-long attribute name in the header was imported")
    assert [r.email for r in _subscribers(engine)] == ["ok@example.org"]


def test_forms_say_it_in_both_languages(client: Any, engine: sa.Engine,
                                        make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list(engine)
    with engine.begin() as conn:
        member = lists.add_member(conn, list_id, "form@example.org", "Form")
    browser = Browser(client, make_user("admin"))
    url = f"/lists/{list_id}/subscribers/{member['id']}"
    form = {"csrf_token": browser.token, "email": "form@example.org", "name": "Form",
            "status": "active",
            "attributes": "bio: " + "v" * (text_limits.ATTRIBUTE_VALUE + 1)}
    english = client.post(url, data=form, headers={"Accept-Language": "en"})
    assert english.status_code == 422
    assert "attributes.bio is longer than 2000 characters" in english.get_data(as_text=True)
    spanish = client.post(url, data=form, headers={"Accept-Language": "es"})
    assert spanish.status_code == 422
    assert "attributes.bio tiene más de 2000 caracteres" in spanish.get_data(as_text=True)
    long_key = {**form, "attributes": "k" * (text_limits.ATTRIBUTE_NAME + 1) + ": v"}
    page = client.post(url, data=long_key, headers={"Accept-Language": "es"})
    assert page.status_code == 422
    assert "un nombre de atributo tiene más de 100 caracteres" in page.get_data(as_text=True)
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT attributes FROM subscribers WHERE id = :i"),
                              {"i": member["id"]}).scalar_one()
    assert stored == {}
    note = client.post("/admin/suppressions/add", data={
        "csrf_token": browser.token, "emails": "s@example.org",
        "note": "n" * (text_limits.SUPPRESSION_NOTE + 1)},
        headers={"Accept-Language": "es"}, follow_redirects=True)
    assert "note tiene más de 500 caracteres" in note.get_data(as_text=True)
    with engine.connect() as conn:
        assert suppression_list.get(conn, "s@example.org") is None
