"""Layouts, against real PostgreSQL and the engine's own message
builder: a layout must carry the unsubscribe placeholder and the content one; what the
worker builds for a campaign in a layout has the header, the body, the recipient's own
unsubscribe link and the postal address (escaped, never template code) in its HTML and in
the generated text part; the preview shows the same; the text part can be generated and
then edited; a layout changes only while no send uses it; the API, pages and roles."""

from __future__ import annotations

from collections.abc import Callable
from email import message_from_bytes, policy
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser
from webapp.domain import campaigns, layouts, lists
from webapp.domain.errors import Conflict, Invalid
from workers import queue
from workers.building.compose import Composer

LAYOUT = ("<html><body><header>ACME NEWS</header>{{ content }}<footer>"
          "{{ postal_address }} · <a href=\"{{ unsubscribe_url }}\">Unsubscribe</a>"
          "</footer></body></html>")
ADDRESS = "Calle Mayor 1 {{ 7*7 }}\n28013 Madrid <b>"


def _layout(engine: sa.Engine, html: str = LAYOUT) -> dict[str, Any]:
    with engine.begin() as conn:
        return layouts.create(conn, {"name": "News", "html": html,
                                     "postal_address": ADDRESS})


def _campaign(engine: sa.Engine, layout_id: int | None, **extra: Any) -> dict[str, Any]:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, f"L{layout_id}-{len(extra)}")["id"])
        lists.add_subscribers(conn, list_id, [{"email": "ada@example.org", "name": "Ada"}])
        return campaigns.create(conn, {"name": "Spring", "list_id": list_id,
                                       "subject": "Spring", "layout_id": layout_id,
                                       "html": "<p>Hello {{ name }}</p>", **extra},
                                default_from="news@example.com")


def test_a_layout_must_hold_content_and_unsubscribe_and_compile(engine: sa.Engine) -> None:
    cases = [
        ({"name": "x", "html": "<p>{{ unsubscribe_url }}</p>"}, "html", "{{ content }}"),
        ({"name": "x", "html": "{{ content }}{{ content }}{{ unsubscribe_url }}"}, "html",
         "exactly once"),
        ({"name": "x", "html": "<p>{{ content }}</p>"}, "html", "{{ unsubscribe_url }}"),
        ({"name": "x", "html": "{{ content }}{{ unsubscribe_url }}{% if %}"}, "html",
         "line 1"),
        ({"name": " ", "html": LAYOUT}, "name", "required"),
        ({"name": "x", "html": LAYOUT, "postal_address": "a" * 501}, "postal_address",
         "at most 500"),
    ]
    with engine.begin() as conn:
        for data, field, words in cases:
            with pytest.raises(Invalid) as caught:
                layouts.create(conn, data)
            assert words in str(caught.value.fields[field]), (data, caught.value.fields)
        layouts.create(conn, {"name": "Ok", "html": LAYOUT})
        with pytest.raises(Conflict):
            layouts.create(conn, {"name": "OK", "html": LAYOUT})


def test_the_worker_builds_the_campaign_inside_its_layout(
        engine: sa.Engine, config_for: Callable[..., Any]) -> None:
    layout = _layout(engine)
    campaign = _campaign(engine, layout["id"])
    with engine.begin() as conn:
        campaign = campaigns.send(conn, campaign["id"])
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        [job] = queue.claim_batch(conn, "w", 5, "example.org")
    envelope = Composer(engine, config_for()).build(job)
    mail = message_from_bytes(envelope.message, policy=policy.default)
    html = mail.get_body(("html",)).get_content().replace("\r\n", "\n")  # type: ignore[union-attr]
    text = mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    unsubscribe = mail["List-Unsubscribe"].strip("<>")
    assert "<header>ACME NEWS</header><p>Hello Ada</p><footer>" in html
    assert f'href="{unsubscribe}"' in html
    # The address is text: escaped, its braces are not template code, its lines kept.
    assert "Calle Mayor 1 &#123;&#123; 7*7 &#125;&#125;<br>\n28013 Madrid &lt;b&gt;" in html
    assert "49" not in html
    assert "ACME NEWS" in text and "Hello Ada" in text and unsubscribe in text
    assert "Calle Mayor 1 {{ 7*7 }}" in text


def test_preview_and_test_send_use_the_layout(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    layout = _layout(engine)
    campaign = _campaign(engine, layout["id"])
    with engine.connect() as conn:
        shown = campaigns.preview(conn, campaign["id"], base_url="http://x",
                                  secret_key="k")
    assert shown["error"] is None
    assert "ACME NEWS" in shown["rendered"].html and "Hello Ada" in shown["rendered"].html
    marketer = Browser(client, make_user("marketer"))
    frame = marketer.get(f"/campaigns/{campaign['id']}/preview.html").get_data(as_text=True)
    assert "<header>ACME NEWS</header>" in frame
    sample = marketer.get(f"/layouts/{layout['id']}/preview.html")
    assert sample.status_code == 200 and "sandbox" in sample.headers["Content-Security-Policy"]
    assert "ACME NEWS" in sample.get_data(as_text=True)


def test_text_from_html_is_generated_then_editable(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    layout = _layout(engine)
    marketer = Browser(client, make_user("marketer"))
    r = marketer.post("/layouts/text", {"html": "<h1>Hi {{ name }}</h1><p>News</p>",
                                        "layout_id": str(layout["id"]), "text": ""})
    fragment = r.get_data(as_text=True)
    assert r.status_code == 200 and 'id="compose-text"' in fragment
    assert "ACME NEWS" in fragment and "Hi {{ name }}" in fragment
    assert "Unsubscribe ({{ unsubscribe_url }})" in fragment
    empty = marketer.post("/layouts/text", {"html": "", "text": "kept"}).get_data(as_text=True)
    assert "Write an HTML body first" in empty and "kept" in empty
    # The edited text is what is sent, not the generated one.
    campaign = _campaign(engine, layout["id"], text="My own text {{ unsubscribe_url }}")
    assert campaign["text_body"] == "My own text {{ unsubscribe_url }}"


def test_a_layout_in_use_by_a_send_cannot_change_nor_be_deleted(engine: sa.Engine) -> None:
    layout = _layout(engine)
    draft = _campaign(engine, layout["id"])
    before = draft["updated_at"]
    with engine.begin() as conn:
        layouts.update(conn, layout["id"], {"name": "News", "html": LAYOUT + " ",
                                            "postal_address": ""})
        assert campaigns.get(conn, draft["id"])["updated_at"] > before  # workers recompile
        with pytest.raises(Conflict):
            layouts.delete(conn, layout["id"])
        campaigns.send(conn, draft["id"])
        with pytest.raises(Conflict) as caught:
            layouts.update(conn, layout["id"], {"name": "News", "html": LAYOUT})
        assert "Spring" in str(caught.value.message)


def test_api_and_roles(client: Any, engine: sa.Engine,
                       make_user: Callable[..., dict[str, Any]]) -> None:
    api = Api(client, make_user("marketer")["token"])
    r = api.post("/layouts", {"name": "News", "html": LAYOUT, "postal_address": "Madrid"})
    assert r.status_code == 201, r.json
    layout_id = r.json["id"]
    assert api.get("/layouts").json["layouts"][0]["name"] == "News"
    bad = api.post("/layouts", {"name": "Bad", "html": "{{ content }}"})
    assert bad.status_code == 422 and "html" in bad.json["error"]["fields"]
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "L")["id"])
    r = api.post("/campaigns", {"name": "c", "list_id": list_id, "subject": "s",
                                "html": "<p>x</p>", "layout_id": layout_id})
    assert r.status_code == 201 and r.json["layout_id"] == layout_id
    assert api.post("/campaigns", {"name": "c", "list_id": list_id, "subject": "s",
                                   "html": "<p>x</p>", "layout_id": 999999}).status_code == 404
    for wrong in (False, "1", [1]):  # not a layout id (false is not 0, nor null)
        r = api.post("/campaigns", {"name": "c", "list_id": list_id, "subject": "s",
                                    "html": "<p>x</p>", "layout_id": wrong})
        assert r.status_code == 422 and "layout_id" in r.json["error"]["fields"], wrong
    r = api.post("/campaigns", {"name": "c", "list_id": list_id, "subject": "s",
                                "html": "<p>x</p>", "layout_id": float(layout_id)})
    assert r.status_code == 201 and r.json["layout_id"] == layout_id  # 240.0 is an integer
    assert api.delete(f"/layouts/{layout_id}").status_code == 409
    support = Api(client, make_user("support")["token"])
    assert support.get("/layouts").status_code == 403
    assert Browser(client, make_user("support")).get("/layouts/").status_code == 403


def test_layout_pages_in_both_languages(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get("/layouts/").get_data(as_text=True)
    assert 'id="layout-editor"' in page and "{{ unsubscribe_url }}" in page
    r = marketer.post("/layouts/", {"name": "News", "html": "<p>{{ content }}</p>",
                                    "postal_address": ""}, follow_redirects=False)
    assert r.status_code == 422
    assert "put {{ unsubscribe_url }} in it" in r.get_data(as_text=True)
    # Said once: "Not saved: check html", never "Not saved: the layout was not saved: html".
    assert "Not saved:</strong> check html" in r.get_data(as_text=True)
    r = marketer.post("/layouts/", {"name": "News", "html": LAYOUT, "postal_address": "M"})
    assert "Layout “News” saved." in r.get_data(as_text=True)
    assert 'id="layout-preview"' in r.get_data(as_text=True)
    es = marketer.get("/layouts/", headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "Plantillas de diseño" in es and "Dirección postal" in es


def test_the_review_page_sees_the_unsubscribe_link_of_the_layout(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """The layout carries the unsubscribe link (it must): the review page once warned "no
    visible unsubscribe link" for such a campaign because it read the body alone."""
    from webapp.domain import sending_domains
    assert sending_domains.has_visible_unsubscribe(None, "<p>Hi</p>", LAYOUT)
    assert not sending_domains.has_visible_unsubscribe("{{ unsubscribe_url }}",
                                                       "<p>Hi</p>", None)
    in_layout = _campaign(engine, _layout(engine)["id"])
    bare = _campaign(engine, None, text="no link")
    marketer = Browser(client, make_user("marketer"))
    assert "no visible unsubscribe link" not in marketer.get(
        f"/campaigns/{in_layout['id']}/send").get_data(as_text=True)
    assert "no visible unsubscribe link" in marketer.get(
        f"/campaigns/{bare['id']}/send").get_data(as_text=True)
