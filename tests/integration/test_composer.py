"""The composer tells the whole truth before sending: every template error of
every field at once, variables no recipient has (checked against the list's real attribute
keys) at save and on the review page, wording that says "schedule" when scheduling, a
preview picker over the whole list that previews what it shows, a remembered test address,
and sent campaigns that are read-only with a Duplicate action."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, make_campaign
from webapp.domain import composer, lists


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def _list_with(engine: sa.Engine, n: int = 3, **attributes: str) -> int:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Readers")["id"])
        lists.add_subscribers(conn, list_id, [
            {"email": f"reader{i:02d}@example.org", "name": f"Reader {i:02d}",
             "attributes": attributes} for i in range(n)])
    return list_id


def _compose(browser: Browser, list_id: int, **fields: str) -> Any:
    data = {"name": "Autumn", "list_id": str(list_id), "from": "", "subject": "Hi",
            "html": "", "text": ""}
    data.update(fields)
    return browser.post("/campaigns/new", data)


def test_every_template_error_of_every_field_at_once(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list_with(engine)
    browser = Browser(client, make_user("marketer"))
    r = _compose(browser, list_id, subject="Hi {{ name",
                 html="<p>ok</p>\n<p>{% if name %}</p>\n",
                 text="line one\nline two\n{{ name }\n")
    page = _text(r.get_data(as_text=True))
    assert r.status_code == 422
    assert "3 template errors" in page
    assert "subject, line 1" in page and "html" in page and "text, line 3" in page
    assert "text, line 3: {{ name }" in page  # the offending line is quoted
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar() == 0


def test_undefined_variables_are_named_against_the_lists_keys(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list_with(engine, city="Lyon", plan="pro")
    browser = Browser(client, make_user("marketer"))
    r = _compose(browser, list_id, text="Hello {{ nmae }} from {{ attributes.ctiy }}, "
                                        "plan {{ attributes['plan'] }}")
    page = _text(r.get_data(as_text=True))
    assert r.status_code == 200 and "Draft saved" in page  # saved: it may be intended
    assert "attribute “ctiy”" in page and "The list's attributes: city, plan" in page
    assert "Did you mean “city”?" in page
    assert "“nmae” is not a variable" in page and "Did you mean “name”?" in page
    assert "“plan”" not in page  # a key the list has is not reported
    campaign_id = int(re.search(r"/campaigns/(\d+)/send", r.get_data(as_text=True))[1])
    review = _text(browser.get(f"/campaigns/{campaign_id}/send").get_data(as_text=True))
    assert "Check before sending" in review and "attribute “ctiy”" in review


def test_unit_undefined_variables_ignores_loop_and_set_names() -> None:
    problems = composer.undefined_variables(
        {"text": "{% set greeting = 'hi' %}{{ greeting }} {% for x in [1] %}{{ x }}"
                 "{{ loop.index }}{% endfor %}{{ subscriber.attributes.zip }}"},
        ["city"])
    assert [p.message.split(",")[0] for p in problems] == [
        "no subscriber on the list has the attribute “zip”"]


def test_review_page_says_schedule_when_scheduling(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, [f"a{i}@example.org" for i in range(4)], send=False)
    page = Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}/send").get_data(as_text=True)
    assert "Send now to 4 recipients" in page and "Schedule for 4 recipients" in page
    confirms = re.findall(r'data-confirm="([^"]+)"', page)
    assert any("now? Once sent, messages cannot be recalled" in c for c in confirms)
    assert any(c.startswith("Schedule") and "unschedule" in c for c in confirms)


def test_preview_picker_searches_the_whole_list_and_previews_what_it_shows(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list_with(engine, n=30)
    browser = Browser(client, make_user("marketer"))
    r = _compose(browser, list_id, subject="For {{ name }}", text="Dear {{ name }}")
    campaign_id = int(re.search(r"/campaigns/(\d+)/send", r.get_data(as_text=True))[1])
    first = browser.get(f"/campaigns/{campaign_id}/preview").get_data(as_text=True)
    shown = re.search(r'aria-current="true" class="current">([^<]+)<', first)[1]
    assert shown.startswith("reader00@") and "Previewing as <strong>reader00@" in first
    assert "Dear Reader 00" in first
    found = browser.get(f"/campaigns/{campaign_id}/preview?q=reader29").get_data(as_text=True)
    assert "reader29@example.org" in found  # beyond the first 20
    assert "Previewing as <strong>reader29@example.org" in found and "Dear Reader 29" in found
    assert re.search(r'aria-current="true" class="current">reader29@', found)
    none = browser.get(f"/campaigns/{campaign_id}/preview?q=nobody").get_data(as_text=True)
    assert "No subscriber on this list matches" in none and "Previewing as" not in none
    assert "Send test as" not in first  # the button no longer reads as sending to them


def test_test_address_is_prefilled_and_remembered(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, ["a@example.org"], send=False)
    user = make_user("marketer")
    browser = Browser(client, user)
    page = browser.get(f"/campaigns/{campaign['id']}").get_data(as_text=True)
    assert f'name="email" required value="{user["email"]}"' in page
    browser.post(f"/campaigns/{campaign['id']}/test", {"email": "inbox@example.net"})
    again = browser.get(f"/campaigns/{campaign['id']}/preview").get_data(as_text=True)
    assert 'name="email" required value="inbox@example.net"' in again


def test_a_sent_campaign_is_read_only_with_duplicate(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, ["a@example.org"], name="Launch")  # now sending
    browser = Browser(client, make_user("marketer"))
    edit = browser.get(f"/campaigns/{campaign['id']}/edit", follow_redirects=True)
    page = edit.get_data(as_text=True)
    assert edit.request.path == f"/campaigns/{campaign['id']}"  # no editable form
    assert "what was sent cannot change" in page and "Duplicate as a new draft" in page
    stale = browser.post(f"/campaigns/{campaign['id']}/edit", {
        "name": "Launch", "list_id": str(campaign["list_id"]), "from": "",
        "subject": "Edited subject", "text": "edited body", "html": ""})
    kept = stale.get_data(as_text=True)
    assert stale.status_code == 409 and "edited body</textarea>" in kept  # nothing lost
    assert 'action="/campaigns/new"' in kept and "Save as a new draft" in kept
    dup = browser.post(f"/campaigns/{campaign['id']}/duplicate")
    assert re.fullmatch(r"/campaigns/\d+/edit", dup.request.path)
    assert "Launch (copy)" in dup.get_data(as_text=True)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, status, subject FROM campaigns ORDER BY id")
                            ).all()
    assert [tuple(r) for r in rows] == [("Launch", "sending", "Hello {{ name }}"),
                                        ("Launch (copy)", "draft", "Hello {{ name }}")]


def test_the_unknown_variable_warning_shows_whenever_it_applies(
        client: Any, engine: sa.Engine, make_user: Any) -> None:
    """The warning showed once after saving (a flash) and never again except on
    Review. It is on the draft's page, in the composer and on Review as long as it applies,
    in the page's language."""

    campaign = make_campaign(engine, ["a@example.org"], send=False)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE campaigns SET text_body = 'Hi {{ nmae }}' WHERE id = :c"),
                     {"c": campaign["id"]})
    browser = Browser(client, make_user("marketer"))
    for path in (f"/campaigns/{campaign['id']}", f"/campaigns/{campaign['id']}/edit",
                 f"/campaigns/{campaign['id']}/send"):
        for _ in range(2):  # every time, not once
            page = browser.get(path).get_data(as_text=True)
            assert 'id="review-warnings"' in page and "nmae" in page, path
        spanish = browser.get(path, headers={"Accept-Language": "es"}).get_data(as_text=True)
        assert "Revisa antes de enviar" in spanish and "no es una variable" in spanish, path
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE campaigns SET text_body = 'Hi {{ name }}' WHERE id = :c"),
                     {"c": campaign["id"]})
    assert 'id="review-warnings"' not in browser.get(f"/campaigns/{campaign['id']}").get_data(
        as_text=True)
