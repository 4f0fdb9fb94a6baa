"""Analytics, private by default, against real PostgreSQL, the real
worker pool and the test SMTP sink: tracking is off unless turned on; when on, the
delivered messages carry signed tracking links and an open pixel; following them records
the events and redirects to the stored URL only; forged, altered and unknown URLs are a
404; counts are exact under concurrent clicks; the figures show on the campaign page and
in the API."""

from __future__ import annotations

import email
import email.policy
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api, wait_for
from tests.helpers import Browser, campaign_status
from webapp.domain import campaigns, lists, tracking
from workers.building import tracking as signing
from workers.core.settings import Config
from workers.delivery.pool import Pool

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()
BASE = "http://127.0.0.1:5000"
HTML = """<html><body><p>Hi {{ name }}</p>
<p><a href="https://shop.example/sale?a=1&amp;b=2">Sale</a>
<a href="https://blog.example/post">Blog</a>
<a href="{{ unsubscribe_url }}">Unsubscribe</a></p></body></html>"""
TEXT = ("Hi {{ name }}\nSale: https://shop.example/sale?a=1&b=2\n"
        "Unsubscribe: {{ unsubscribe_url }}\n")


def _campaign(engine: sa.Engine, emails: list[str], *, opens: bool = False,
              clicks: bool = False, html: str = HTML, text: str | None = TEXT) -> int:
    with engine.begin() as conn:
        taken = conn.execute(sa.text("SELECT count(*) FROM lists")).scalar()
        lst = lists.create_list(conn, f"Readers {taken + 1}" if taken else "Readers")
        lists.add_subscribers(conn, lst["id"], [{"email": e, "name": e.split("@")[0]}
                                                for e in emails])
        campaign = campaigns.create(conn, {"name": "Sale", "list_id": lst["id"],
                                           "subject": "Sale", "html": html, "text": text},
                                    default_from="news@example.com")
        tracking.save_settings(conn, campaign["id"], {"track_opens": opens,
                                                      "track_clicks": clicks}, actor="t")
        campaigns.send(conn, campaign["id"])
    return int(campaign["id"])


def _deliver(engine: sa.Engine, config: Config, campaign_id: int) -> None:
    pool = Pool(engine, config, node="test-node")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign_id) == "sent", timeout=60,
                 message="campaign to finish")
    finally:
        pool.stop()


def _messages(sink: Any) -> dict[str, email.message.EmailMessage]:
    out = {}
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, email.message.EmailMessage)
        out[str(message["To"])] = message
    return out


def _part(message: email.message.EmailMessage, kind: str) -> str:
    body = message.get_body(preferencelist=(kind,))
    assert body is not None
    return str(body.get_content())


def _path(url: str) -> str:
    assert url.startswith(BASE + "/"), url
    return url.removeprefix(BASE)


def _events(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM campaign_events ORDER BY id")).mappings()]


def test_off_by_default_nothing_is_rewritten_or_recorded(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config], client: Any,
        api: Api) -> None:
    campaign_id = _campaign(engine, ["ann@example.org"])
    _deliver(engine, config_for(sink.port), campaign_id)
    message = _messages(sink)["ann@example.org"]
    html, text = _part(message, "html"), _part(message, "plain")
    assert 'href="https://shop.example/sale?a=1&amp;b=2"' in html
    assert "/r/" not in html and "/o/" not in html and "<img" not in html
    assert "https://shop.example/sale?a=1&b=2" in text
    stats = api.get(f"/campaigns/{campaign_id}/stats").get_json()
    assert stats["tracking"] == {"track_opens": False, "track_clicks": False,
                                 "archive": False}
    assert stats["opens"] == stats["clicks"] == {"total": 0, "unique": 0}
    assert stats["links"] == [] and stats["sent"] == 1
    # A genuine-looking open of an untracked campaign records nothing.
    with engine.connect() as conn:
        job_id, subscriber_id = conn.execute(sa.text(
            "SELECT id, subscriber_id FROM delivery_jobs WHERE campaign_id = :c"),
            {"c": campaign_id}).one()
    url = signing.open_url(BASE, SECRET, campaign_id, job_id, subscriber_id)
    assert client.get(_path(url)).status_code == 200
    assert _events(engine) == []


def test_tracked_messages_record_opens_and_clicks_and_redirect_to_the_stored_url(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config], client: Any,
        api: Api) -> None:
    emails = ["ann@example.org", "bob@example.org", "cy@example.org"]
    campaign_id = _campaign(engine, emails, opens=True, clicks=True)
    _deliver(engine, config_for(sink.port), campaign_id)
    messages = _messages(sink)
    assert set(messages) == set(emails)
    links: dict[str, list[str]] = {}
    pixels: dict[str, str] = {}
    for address, message in messages.items():
        html, text = _part(message, "html"), _part(message, "plain")
        links[address] = re.findall(r'href="(http://127\.0\.0\.1:5000/r/[^"]+)"', html)
        assert len(links[address]) == 2, html  # the sale and the blog; not the unsubscribe
        assert 'href="http://127.0.0.1:5000/u/' in html
        assert "shop.example" not in html and "blog.example" not in html
        (pixel,) = re.findall(r'<img src="(http://127\.0\.0\.1:5000/o/[^"]+\.gif)"', html)
        pixels[address] = pixel
        # The text part's link is tracked too, the unsubscribe link is not.
        assert re.search(r"Sale: http://127\.0\.0\.1:5000/r/\S+", text), text
        assert "shop.example" not in text and "127.0.0.1:5000/u/" in text

    sale, blog = links["ann@example.org"]
    r = client.get(_path(sale))
    assert r.status_code == 302 and r.headers["Location"] == "https://shop.example/sale?a=1&b=2"
    assert r.headers["Cache-Control"].startswith("no-store")
    assert client.get(_path(sale)).status_code == 302  # twice: total 2, unique 1
    r = client.get(_path(blog))
    assert r.status_code == 302 and r.headers["Location"] == "https://blog.example/post"
    assert client.get(_path(links["bob@example.org"][0])).status_code == 302
    for address in ("ann@example.org", "ann@example.org", "cy@example.org"):
        r = client.get(_path(pixels[address]))
        assert r.status_code == 200 and r.mimetype == "image/gif"
        assert r.data == tracking.PIXEL

    stats = api.get(f"/campaigns/{campaign_id}/stats").get_json()
    assert stats["opens"] == {"total": 3, "unique": 2}
    assert stats["clicks"] == {"total": 4, "unique": 2}
    by_url = {link["url"]: (link["total"], link["unique"]) for link in stats["links"]}
    assert by_url == {"https://shop.example/sale?a=1&b=2": (3, 2),
                      "https://blog.example/post": (1, 1)}
    assert len(stats["timeline"]) == 1 and stats["timeline"][0]["opens"] == 3
    assert stats["timeline"][0]["clicks"] == 4 and stats["timeline"][0]["unique_clicks"] == 2
    daily = api.get(f"/campaigns/{campaign_id}/stats?by=day").get_json()
    assert daily["by"] == "day" and daily["timeline"][0]["at"].endswith("T00:00:00+00:00")
    events = _events(engine)
    assert {e["kind"] for e in events} == {"open", "click"} and len(events) == 7
    assert all(e["broadcast_id"] is not None for e in events)


def test_forged_altered_and_unknown_urls_are_a_404_never_a_redirect(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config],
        client: Any) -> None:
    campaign_id = _campaign(engine, ["ann@example.org"], opens=True, clicks=True)
    other_id = _campaign(engine, ["zed@example.org"], clicks=True,
                         html='<a href="https://other.example/">x</a>', text=None)
    _deliver(engine, config_for(sink.port), campaign_id)
    _deliver(engine, config_for(sink.port), other_id)
    html = _part(_messages(sink)["ann@example.org"], "html")
    sale = _path(re.findall(r'href="(http://127\.0\.0\.1:5000/r/[^"]+)"', html)[0])
    token = sale.removeprefix("/r/")
    c, j, s, link, mac = token.split(".")
    with engine.connect() as conn:
        other_link = conn.execute(sa.text(
            "SELECT id FROM campaign_links WHERE campaign_id = :c"), {"c": other_id}).scalar()
    bad = [
        f"{c}.{j}.{s}.{int(link, 16) + 1:x}.{mac}",  # another link, same MAC
        f"{c}.{j}.{s}.{link}.{mac[:-1]}a" if mac[-1] != "a" else f"{c}.{j}.{s}.{link}.{mac[:-1]}b",
        # Genuinely signed, but the link belongs to another campaign: no redirect there.
        signing.click_token(SECRET, campaign_id, int(j, 16), int(s, 16), int(other_link)),
        # Genuinely signed for a link id that does not exist.
        signing.click_token(SECRET, campaign_id, 1, 1, 10**12),
        "https:%2F%2Fevil.example", "garbage", "1.2.3.4.5",
    ]
    for token in bad:
        r = client.get(f"/r/{token}")
        assert r.status_code == 404, token
        assert "Location" not in r.headers
        if "/" not in token and "%" not in token:  # else no route: the app's own 404
            assert "This link does not work" in r.get_data(as_text=True)
    for token in ("garbage.gif", f"{c}.{j}.{s}.{mac}.gif", "x"):
        r = client.get(f"/o/{token}")
        assert r.status_code == 404 and r.mimetype == "image/gif"
    assert _events(engine) == []
    # A redirect parameter is never read.
    r = client.get(f"{sale}?url=https://evil.example/")
    assert r.headers["Location"] == "https://shop.example/sale?a=1&b=2"
    r = client.get("/r/garbage?lang=es")
    assert r.status_code == 404 and "Este enlace no funciona" in r.get_data(as_text=True)


def test_counts_are_exact_under_concurrent_clicks(
        app: Any, engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    emails = [f"r{i}@example.org" for i in range(6)]
    campaign_id = _campaign(engine, emails, opens=True, clicks=True)
    _deliver(engine, config_for(sink.port), campaign_id)
    urls = []
    for message in _messages(sink).values():
        html = _part(message, "html")
        urls.append(_path(re.findall(r'href="(http://127\.0\.0\.1:5000/r/[^"]+)"', html)[0]))
    rounds = 25
    failures: list[int] = []
    start = threading.Barrier(len(urls) * 2)

    def click(path: str) -> None:
        client = app.test_client()
        start.wait()
        for _ in range(rounds):
            status = client.get(path).status_code
            if status != 302:
                failures.append(status)

    threads = [threading.Thread(target=click, args=(u,)) for u in urls * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    with engine.connect() as conn:
        stats = tracking.stats(conn, campaign_id)
    assert stats["clicks"] == {"total": len(urls) * 2 * rounds, "unique": len(urls)}
    (sale,) = [link for link in stats["links"] if "shop.example" in link["url"]]
    assert (sale["total"], sale["unique"]) == (len(urls) * 2 * rounds, len(urls))


def test_campaign_page_and_composer(client: Any, engine: sa.Engine, sink: Any,
                                    config_for: Callable[..., Config],
                                    make_user: Callable[..., dict[str, Any]]) -> None:
    marketer = Browser(client, make_user("marketer"))
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Page list")["id"]
        lists.add_subscribers(conn, list_id, [{"email": "pat@example.org"}])
    page = marketer.get("/campaigns/new").get_data(as_text=True)
    assert 'name="track_opens"' in page and 'name="track_clicks"' in page
    assert "checked" not in page.split('id="tracking-fields"')[1].split("</fieldset>")[0]
    r = marketer.post("/campaigns/new", {"name": "Tracked", "list_id": str(list_id),
                                         "subject": "Hi", "from": "news@example.com",
                                         "html": '<a href="https://a.example/">a</a>',
                                         "text": "", "track_opens": "on",
                                         "track_clicks": "on"})
    text = r.get_data(as_text=True)
    assert r.status_code == 200 and "Opens and clicks are tracked" in text
    with engine.connect() as conn:
        campaign_id = conn.execute(sa.text("SELECT id FROM campaigns WHERE name = 'Tracked'")
                                   ).scalar_one()
        assert tracking.get_settings(conn, campaign_id) == {
            "track_opens": True, "track_clicks": True, "archive": False}
    edit = marketer.get(f"/campaigns/{campaign_id}/edit").get_data(as_text=True)
    assert 'name="track_opens" checked' in edit and 'name="archive" checked' not in edit
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
        with pytest.raises(Exception, match="tracking cannot change"):
            tracking.save_settings(conn, campaign_id, {"track_opens": False}, actor="t")
    # While it sends, the engagement figures say they are as of the page's opening (the
    # counters above them are the live ones, polled every 2 s).
    sending = marketer.get(f"/campaigns/{campaign_id}").get_data(as_text=True)
    assert 'id="engagement-as-of"' in sending
    assert "los contadores de arriba se actualizan en directo" in marketer.get(
        f"/campaigns/{campaign_id}", headers={"Accept-Language": "es"}).get_data(as_text=True)
    _deliver(engine, config_for(sink.port), campaign_id)
    html = _part(_messages(sink)["pat@example.org"], "html")
    client.get(_path(re.findall(r'href="(http://127\.0\.0\.1:5000/r/[^"]+)"', html)[0]))
    page = marketer.get(f"/campaigns/{campaign_id}").get_data(as_text=True)
    assert 'id="campaign-stats"' in page and 'id="engagement-as-of"' not in page
    figures = page.split('id="stat-clicks"')[1].split("</dd>")[0]
    assert "<strong>1</strong>" in figures
    assert "https://a.example/" in page.split('id="link-clicks"')[1]
    spanish = marketer.get(f"/campaigns/{campaign_id}",
                           headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "Se registran las aperturas y los clics" in spanish


def test_stats_api_bad_input(api: Api, engine: sa.Engine,
                             make_user: Callable[..., dict[str, Any]], client: Any) -> None:
    campaign_id = _campaign(engine, ["ann@example.org"])
    assert api.get(f"/campaigns/{campaign_id}/stats?by=week").status_code == 422
    assert api.get("/campaigns/999999/stats").status_code == 404
    support = Api(client, make_user("support")["token"])
    assert support.get(f"/campaigns/{campaign_id}/stats").status_code == 403
    marketer = Api(client, make_user("marketer")["token"])
    assert marketer.get(f"/campaigns/{campaign_id}/stats").status_code == 200


def test_api_creates_a_tracked_campaign_and_refuses_a_bad_setting(api: Api,
                                                                  engine: sa.Engine) -> None:
    list_id = api.post("/lists", {"name": "API list"}).get_json()["id"]
    base = {"name": "API", "list_id": list_id, "subject": "Hi", "text": "Hello"}
    r = api.post("/campaigns", {**base, "track_clicks": True, "archive": True})
    assert r.status_code == 201, r.get_json()
    stats = api.get(f"/campaigns/{r.get_json()['id']}/stats").get_json()
    assert stats["tracking"] == {"track_opens": False, "track_clicks": True, "archive": True}
    r = api.post("/campaigns", {**base, "track_opens": "yes"})
    assert r.status_code == 422
    assert r.get_json()["error"]["fields"] == {"track_opens": "must be true or false"}
    with engine.connect() as conn:  # the refused request left no campaign behind
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar_one() == 1


def test_a_duplicate_keeps_the_choices(client: Any, engine: sa.Engine,
                                       make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Dup list")["id"]
        original = campaigns.create(conn, {"name": "Orig", "list_id": list_id,
                                           "subject": "Hi", "text": "x"},
                                    default_from="news@example.com")
        tracking.save_settings(conn, original["id"], {"track_clicks": True, "archive": True},
                               actor="t")
        campaigns.send(conn, original["id"])
    marketer = Browser(client, make_user("marketer"))
    r = marketer.post(f"/campaigns/{original['id']}/duplicate", follow_redirects=False)
    copy_id = int(r.headers["Location"].rstrip("/").split("/")[-2])
    with engine.connect() as conn:
        assert tracking.get_settings(conn, copy_id) == {
            "track_opens": False, "track_clicks": True, "archive": True}
    edit = marketer.get(f"/campaigns/{copy_id}/edit").get_data(as_text=True)
    assert 'name="track_clicks" checked' in edit and 'name="track_opens" checked' not in edit


def test_a_subscriber_who_refuses_tracking_gets_the_mail_as_written(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config], api: Api) -> None:
    """Consent per subscriber (docs/privacy.md): set through the API, honoured by a
    campaign that tracks opens and clicks; the others are tracked as before; the consent
    can be given again (an update without the field keeps what is stored)."""
    campaign_id = _campaign(engine, ["ann@example.org", "bob@example.org"], opens=True,
                            clicks=True)
    with engine.connect() as conn:
        list_id = conn.execute(sa.text("SELECT list_id FROM campaigns WHERE id = :c"),
                               {"c": campaign_id}).scalar()
    answer = api.post(f"/lists/{list_id}/subscribers",
                      {"subscribers": [{"email": "bob@example.org", "tracking": False}]})
    assert answer.status_code in (200, 201), answer.get_json()
    bad = api.post(f"/lists/{list_id}/subscribers",
                   {"subscribers": [{"email": "cy@example.org", "tracking": "no"}]})
    assert bad.get_json()["errors"][0]["field"] == "tracking"
    _deliver(engine, config_for(sink.port), campaign_id)
    messages = _messages(sink)
    tracked, plain = _part(messages["ann@example.org"], "html"), _part(
        messages["bob@example.org"], "html")
    assert "/r/" in tracked and "/o/" in tracked
    assert 'href="https://shop.example/sale?a=1&amp;b=2"' in plain
    assert "/r/" not in plain and "/o/" not in plain and "<img" not in plain
    assert "https://shop.example/sale?a=1&b=2" in _part(messages["bob@example.org"], "plain")
    with engine.begin() as conn:
        lists.add_subscribers(conn, int(list_id), [{"email": "bob@example.org",
                                                    "name": "Bob"}])
        assert conn.execute(sa.text("SELECT tracking FROM subscribers WHERE email = "
                                    "'bob@example.org'")).scalar() is False
        lists.add_subscribers(conn, int(list_id), [{"email": "BOB@example.org",
                                                    "tracking": True}])
        assert conn.execute(sa.text("SELECT tracking FROM subscribers WHERE email = "
                                    "'bob@example.org'")).scalar() is True
