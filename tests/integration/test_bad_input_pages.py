"""Bad input on pages gets a clear answer, never a 500 nor a busy thread
(P9). Each case is the probe's request, made as the role that can make it.
The walk over every page with hostile values is tests/integration/test_fuzz_api.py
(``test_pages_survive_bad_query_values_and_form_fields``)."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.datastructures import ImmutableMultiDict

from tests.helpers import Browser
from webapp.domain import imports
from webapp.domain.fields import whole_number


def _list(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return int(conn.execute(sa.text(
            "INSERT INTO lists (name) VALUES ('bad input') RETURNING id")).scalar_one())


def _checked(client: Any, browser: Browser, list_id: int, data: bytes) -> str:
    page = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": browser.token, "action": "check",
        "file": (io.BytesIO(data), "people.csv")}, content_type="multipart/form-data")
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text
    return str(re.search(r'action="(/lists/\d+/import/[^"]+)"', text)[1])


def test_the_column_count_of_an_import_is_the_files_not_the_forms(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    list_id = _list(engine)
    browser = Browser(client, make_user("marketer"))
    action = _checked(client, browser, list_id, b"email,name\nann@example.org,Ann\n")
    asked: list[str] = []
    original = ImmutableMultiDict.get

    def counting(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(key))
        return original(self, key, *args, **kwargs)

    monkeypatch.setattr(ImmutableMultiDict, "get", counting)
    for columns in ("5000000", "abc", "²", "-1", "9" * 5000, "", "3"):
        asked.clear()
        started = time.monotonic()
        page = client.post(action, data={"csrf_token": browser.token, "action": "check",
                                         "columns": columns, "role_0": "email"})
        text = page.get_data(as_text=True)
        assert page.status_code == 422, (columns[:10], text[:300])
        assert "does not fit the file" in text and "(2 columns)" in text
        assert sum(1 for k in asked if k.startswith("role_")) == 0  # no loop over N
        assert time.monotonic() - started < 10  # 5,000,000 took 49 s before
    monkeypatch.setattr(ImmutableMultiDict, "get", original)
    done = client.post(action, data={"csrf_token": browser.token, "action": "import",
                                     "columns": "2", "role_0": "email", "role_1": "name"})
    assert done.status_code == 200 and 'id="import-added">1<' in done.get_data(as_text=True)


def test_a_header_of_too_many_columns_is_refused_naming_the_limit(engine: sa.Engine) -> None:
    list_id = _list(engine)
    header = ",".join(["email"] + [f"c{i}" for i in range(imports.MAX_COLUMNS)])
    with engine.begin() as conn, pytest.raises(imports.Invalid) as refused:
        imports.import_csv(conn, list_id, io.BytesIO(f"{header}\na@example.org\n".encode()))
    assert "at most 1000" in str(refused.value.message)
    assert set(refused.value.fields) == {"file"}


def test_the_admin_suppression_form_adds_an_address(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    browser = Browser(client, make_user("admin"))
    page = browser.client.post("/admin/suppressions/add", data={
        "emails": "valid@example.com\nother@example.com", "reason": "manual",
        "csrf_token": browser.token}, follow_redirects=True)
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text[:500]
    assert "Suppressed 2 addresses." in text
    again = browser.client.post("/admin/suppressions/add", data={
        "emails": "valid@example.com", "reason": "manual", "csrf_token": browser.token},
        follow_redirects=True).get_data(as_text=True)
    assert "Suppressed 0 addresses. 1 was already on the list." in again
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM suppressions")).scalar() == 2


@pytest.mark.parametrize("path", [
    "/inbox/?kind=zzz", "/jobs/?kind=zzz", "/jobs/?kind=onboarding", "/inbox/?kind=onboarding",
    "/jobs/?campaign=²", "/inbox/?campaign=" + "9" * 5000, "/inbox/?q=²",
    "/lists/{list}?after=²", "/lists/{list}?before=" + "9" * 30,
    "/admin/audit?before=²", "/campaigns/new?list=²",
])
def test_unknown_filters_and_odd_numbers_are_not_500(
        path: str, client: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    browser = Browser(client, make_user("admin"))
    answer = browser.get(path.format(list=_list(engine)))
    assert answer.status_code in (200, 400, 422), (path[:40], answer.status_code)


def test_whole_numbers_are_ascii_digits_within_a_bigint() -> None:
    assert [whole_number(t) for t in ("0", "42", str(2**63 - 1))] == [0, 42, 2**63 - 1]
    for text in ("", "-1", "²", "٣", "1.5", " 1", "1e3", str(2**63), "9" * 5000, None):
        assert whole_number(text) is None, text
    assert whole_number("1441", high=1440) is None


def test_head_of_a_campaigns_edit_page_without_a_body_is_not_500(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """``HEAD /campaigns/N/edit`` with no body ran the save path (500)."""
    from tests.helpers import make_campaign

    campaign = make_campaign(engine, ["head-edit@example.org"])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE campaigns SET status = 'draft' WHERE id = :c"),
                     {"c": campaign["id"]})
    browser = Browser(client, make_user("admin"))
    url = f"/campaigns/{campaign['id']}/edit"
    head = client.head(url)
    assert head.status_code == browser.get(url).status_code == 200
    assert head.get_data() == b""


@pytest.mark.parametrize("token", ["1.2.3.4.ß" + "a" * 12, "1.2.3.4.ab\u0663", "\u0661.2.3.4.abc",
                                   "1.2.3.4.%FF%FE", "1.2.3.4." + "é" * 40])
@pytest.mark.parametrize("prefix", ["/r/", "/o/"])
def test_tracking_links_with_a_non_ascii_signature_are_not_500(
        client: Any, prefix: str, token: str) -> None:
    """Anonymous clicks and opens with a non-ASCII signature (500 before)."""
    answer = client.get(prefix + token)
    assert answer.status_code in (400, 404, 422), (prefix, token, answer.status_code)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_json_non_finite_numbers_are_422_naming_the_field(api: Any, engine: sa.Engine,
                                                          number: str) -> None:
    """``NaN``, ``Infinity`` and ``1e400`` answered 400 without naming the field
    (and ``1e400`` as a segment value was stored as "inf")."""
    list_id = _list(engine)
    body = ('{"name": "nf", "list_id": ' + str(list_id)
            + ', "subject": "Hi", "text": "x", "segment_id": ' + number + "}")
    answer = api.post("/campaigns", data=body, content_type="application/json")
    assert answer.status_code == 422, answer.get_data(as_text=True)
    assert answer.get_json()["error"]["fields"] == {"segment_id": "must be a finite number"}
    nested = api.post(f"/lists/{list_id}/subscribers", data=(
        '{"subscribers": [{"email": "n@example.org", "attributes": {"score": ' + number
        + "}}]}"), content_type="application/json")
    assert nested.status_code == 422
    assert list(nested.get_json()["error"]["fields"]) == ["subscribers.0.attributes.score"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar_one() == 0
