"""Lists and subscribers: exact cheap counts, keyset paging, search, one-at-a-time edits,
export, and the pages that show them (real PostgreSQL)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser, make_campaign
from webapp.domain import lists
from webapp.domain.errors import Conflict, Invalid


def _list_with(engine: sa.Engine, n: int, name: str = "Readers") -> int:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, name)["id"])
        lists.add_subscribers(conn, list_id, [
            {"email": f"Reader{i:04d}@Example.org", "name": f"Reader {i}",
             "attributes": {"plan": "pro" if i % 2 else "free"}} for i in range(n)])
    return list_id


def test_list_size_is_exact_without_counting(engine: sa.Engine) -> None:
    list_id = _list_with(engine, 30)
    with engine.begin() as conn:
        assert lists.get_list(conn, list_id)["subscribers"] == 30
        member = lists.subscriber_page(conn, list_id, limit=1)["rows"][0]
        lists.remove_member(conn, list_id, member["id"], actor="t")
        lists.add_subscribers(conn, list_id, [{"email": "reader0001@example.org"},
                                              {"email": "new@example.org"}])
        assert lists.get_list(conn, list_id)["subscribers"] == 30
        real = conn.execute(sa.text("SELECT count(*) FROM memberships WHERE list_id = :l"),
                            {"l": list_id}).scalar()
        assert real == 30
        # Deleting a subscriber outright (cascade) keeps the count exact too.
        conn.execute(sa.text("DELETE FROM subscribers WHERE lower(email) = 'new@example.org'"))
        assert lists.get_list(conn, list_id)["subscribers"] == 29


def test_keyset_pages_forward_backward_and_search(engine: sa.Engine) -> None:
    list_id = _list_with(engine, 120)
    with engine.connect() as conn:
        first = lists.subscriber_page(conn, list_id)
        assert len(first["rows"]) == 50 and first["prev_before"] is None
        second = lists.subscriber_page(conn, list_id, after=first["next_after"])
        third = lists.subscriber_page(conn, list_id, after=second["next_after"])
        assert len(third["rows"]) == 20 and third["next_after"] is None
        seen = [r["email"] for p in (first, second, third) for r in p["rows"]]
        assert len(set(seen)) == 120
        back = lists.subscriber_page(conn, list_id, before=third["prev_before"])
        assert [r["id"] for r in back["rows"]] == [r["id"] for r in second["rows"]]
        found = lists.subscriber_page(conn, list_id, query="READER0042")
        assert [r["email"] for r in found["rows"]] == ["Reader0042@example.org"]
        by_name = lists.subscriber_page(conn, list_id, query="reader 11")
        assert {r["name"] for r in by_name["rows"]} == {"Reader 11", *(f"Reader {i}" for i in
                                                                      range(110, 120))}
        assert lists.subscriber_page(conn, list_id, query="100%_")["rows"] == []


def test_rename_and_delete(engine: sa.Engine) -> None:
    list_id = _list_with(engine, 3)
    with engine.begin() as conn:
        assert lists.rename_list(conn, list_id, " Customers ", actor="t")["name"] == "Customers"
        with pytest.raises(Invalid):
            lists.rename_list(conn, list_id, "  ", actor="t")
    campaign = make_campaign(engine, ["a@example.org"], send=False, name="Uses it")
    with engine.begin() as conn, pytest.raises(Conflict, match="Uses it"):
        lists.delete_list(conn, campaign["list_id"], actor="t")
    with engine.begin() as conn:
        lists.delete_list(conn, list_id, actor="t")
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar() == 4
        actions = conn.execute(sa.text("SELECT action FROM audit_log ORDER BY id")).scalars()
        assert {"list.create", "list.rename", "list.delete"} <= set(actions)


def test_update_member_keeps_addresses_unique(engine: sa.Engine) -> None:
    list_id = _list_with(engine, 2)
    with engine.begin() as conn:
        a, b = lists.subscriber_page(conn, list_id)["rows"]
        with pytest.raises(Conflict):
            lists.update_member(conn, list_id, a["id"], email=b["email"].upper(), name="x",
                                attributes={}, status="active", actor="t")
    with engine.begin() as conn:
        updated = lists.update_member(conn, list_id, a["id"], email="changed@example.org",
                                      name="Changed", attributes={"plan": "team"},
                                      status="unsubscribed", actor="t")
    assert (updated["email"], updated["status"], updated["attributes"]) == (
        "changed@example.org", "unsubscribed", {"plan": "team"})
    with pytest.raises(Invalid, match="line 2"):
        lists.parse_attributes("plan: pro\nnonsense")


def test_export_streams_csv_that_imports_back(engine: sa.Engine) -> None:
    list_id = _list_with(engine, 7)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "formula@example.org",
                                               "name": "=HYPERLINK(\"x\")"}])
    with engine.connect() as conn:
        text = "".join(lists.export_csv(conn, list_id))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 8
    assert rows[0].keys() == {"email", "name", "status", "added_at", *lists.CONSENT_COLUMNS,
                              "plan"}
    assert {r["plan"] for r in rows} == {"pro", "free", ""}
    assert [r["name"] for r in rows if r["email"] == "formula@example.org"] == [
        "'=HYPERLINK(\"x\")"]


def test_pages_escape_subscriber_fields_and_page(client: Any, engine: sa.Engine,
                                                 make_user: Callable[..., dict[str, Any]]
                                                 ) -> None:
    list_id = _list_with(engine, 60)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "evil@example.org",
                                               "name": "<script>alert(1)</script>",
                                               "attributes": {"<b>k</b>": "<i>v</i>"}}])
    browser = Browser(client, make_user("marketer"))
    page = browser.get(f"/lists/{list_id}").get_data(as_text=True)
    assert "61 subscribers" in page and "Reader0000@example.org" in page
    assert "Next →" in page and "← Previous" not in page
    found = browser.get(f"/lists/{list_id}?q=evil&fragment=subscribers").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in found and "<script>alert" not in found
    assert "&lt;b&gt;k&lt;/b&gt;" in found and 'id="list-subscribers"' in found
    assert "<html" not in found  # the fragment alone
    index = browser.get("/lists/").get_data(as_text=True)
    assert "Readers" in index and "61" in index
    # Add, edit, remove one, through the forms.
    r = browser.post(f"/lists/{list_id}/subscribers",
                     {"email": "one@example.org", "name": "One", "attributes": "plan: pro"})
    assert "one@example.org is on the list" in r.get_data(as_text=True)
    with engine.connect() as conn:
        sid = conn.execute(sa.text("SELECT id FROM subscribers WHERE email = 'one@example.org'"
                                   )).scalar_one()
    r = browser.post(f"/lists/{list_id}/subscribers/{sid}",
                     {"email": "not an address", "name": "One", "attributes": "", "status":
                      "active"})
    assert r.status_code == 422 and "not an address" in r.get_data(as_text=True)
    r = browser.post(f"/lists/{list_id}/subscribers/{sid}/remove")
    assert "removed from the list" in r.get_data(as_text=True)
    export = browser.get(f"/lists/{list_id}/export.csv")
    assert export.headers["Content-Disposition"].startswith("attachment")
    assert export.get_data(as_text=True).count("\n") == 62


def test_support_cannot_reach_lists(client: Any, make_user: Callable[..., dict[str, Any]]
                                    ) -> None:
    browser = Browser(client, make_user("support"))
    assert browser.get("/lists/").status_code == 403
    assert browser.get("/campaigns/").status_code == 403


def test_two_lists_cannot_share_a_name(engine: sa.Engine) -> None:
    """The composer, the import form and the preference page name lists: two with one name
    (in any case) could not be told apart."""
    with engine.begin() as conn:
        first = lists.create_list(conn, "Newsletter")
        other = lists.create_list(conn, "Product news")
    with engine.begin() as conn, pytest.raises(Conflict) as taken:
        lists.create_list(conn, "  newsletter ")
    assert "exists already" in str(taken.value)
    assert taken.value.fields == {"name": "already used"}
    with engine.begin() as conn, pytest.raises(Conflict):
        lists.rename_list(conn, other["id"], "NEWSLETTER")
    with engine.begin() as conn:  # keeping its own name, in another case, is no conflict
        assert lists.rename_list(conn, first["id"], "newsletter")["name"] == "newsletter"


def test_export_writes_attributes_as_json_not_python(engine: sa.Engine) -> None:
    """A list or an object attribute was exported as Python text ({'x': [1, 2]}, True)."""
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Typed")["id"])
        lists.add_subscribers(conn, list_id, [{"email": "t@example.org", "attributes": {
            "tags": ["a", "b"], "vip": True, "score": 1.5, "meta": {"x": [1, 2]},
            "city": "Sevilla"}}])
        text = "".join(lists.export_csv(conn, list_id))
    row = next(r for r in csv.DictReader(io.StringIO(text)) if r["email"] == "t@example.org")
    assert row["tags"] == '["a", "b"]' and row["vip"] == "true" and row["score"] == "1.5"
    assert row["meta"] == '{"x": [1, 2]}' and row["city"] == "Sevilla"
