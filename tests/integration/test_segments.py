"""Segments, against real PostgreSQL: conditions checked with clear
answers and never turned into SQL text, the live count equal to what the enqueue creates
(set-based, through the same chunked statement as a whole list), saved segments reused by
campaigns and frozen on the broadcast, the API and the pages in both languages, roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from webapp.domain import campaigns, lists, segments
from webapp.domain.errors import Conflict, Invalid, NotFound
from workers import queue
from workers.queue import audience

PEOPLE = [
    # email, plan, country, joined (days ago)
    ("ana@example.org", "pro", "ES", 10),
    ("beto@example.org", "pro", "MX", 40),
    ("carla@example.org", "free", "ES", 5),
    ("dan@example.org", "pro", "US", 3),
    ("eva@example.org", "pro", "ES", 400),
    ("fede@example.org", "pro", "AR", 1),
    ("gus@example.org", None, "MX", 2),
    ("hana@example.org", "pro", "mx", 2),
]
PRO_ES_MX = [{"field": "attribute", "key": "plan", "op": "eq", "value": "pro"},
             {"field": "attribute", "key": "country", "op": "in", "value": ["ES", "MX"]}]


def _seed(engine: sa.Engine) -> int:
    """A list of PEOPLE whose memberships are dated ``joined`` days ago."""
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Customers")["id"])
        lists.add_subscribers(conn, list_id, [
            {"email": e, "attributes": {k: v for k, v in (("plan", plan), ("country", c))
                                        if v is not None}}
            for e, plan, c, _ in PEOPLE])
        for email, _, _, days in PEOPLE:
            conn.execute(sa.text(
                "UPDATE memberships m SET created_at = now() - make_interval(days => :d) "
                "FROM subscribers s WHERE s.id = m.subscriber_id AND s.email = :e"),
                {"d": days, "e": email})
    return list_id


def _enqueued(engine: sa.Engine, campaign_id: int) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT email FROM delivery_jobs WHERE campaign_id = :c AND kind = 'broadcast'"),
            {"c": campaign_id}).scalars())


def _send_to(engine: sa.Engine, list_id: int, segment_id: int | None, chunk: int = 1000
             ) -> tuple[dict[str, Any], dict[str, int] | None]:
    with engine.begin() as conn:
        campaign = campaigns.create(conn, {
            "name": "c", "list_id": list_id, "subject": "Hi", "segment_id": segment_id,
            "text": "Hi {{ unsubscribe_url }}"}, default_from="news@example.com")
        campaign = campaigns.send(conn, campaign["id"])
    with engine.begin() as conn:
        summary = queue.enqueue_broadcast(conn, campaign["broadcast_id"], chunk=chunk)
    return campaign, summary


@pytest.mark.parametrize("chunk", [1000, 2])
def test_a_segment_send_enqueues_exactly_who_the_live_count_picks(
        engine: sa.Engine, chunk: int) -> None:
    list_id = _seed(engine)
    with engine.begin() as conn:
        # One of the segment suppressed, one inactive: left out and counted as such.
        conn.execute(sa.text("INSERT INTO suppressions (email, reason) "
                             "VALUES ('beto@example.org', 'unsubscribed')"))
        conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                             "WHERE email = 'eva@example.org'"))
        segment = segments.create(conn, list_id, "Pro ES/MX", PRO_ES_MX)
        count = segments.count(conn, list_id, segment["conditions"])
    assert count == {"members": 3, "suppressed": 1, "inactive": 1, "will_receive": 1,
                     "list_members": 8}  # ana, beto (suppressed), eva (inactive)
    campaign, summary = _send_to(engine, list_id, segment["id"], chunk)
    assert _enqueued(engine, campaign["id"]) == {"ana@example.org"}
    assert summary == {"total": 1, "skipped_suppressed": 1, "skipped_inactive": 1}
    with engine.connect() as conn:
        done = campaigns.with_counts(conn, campaign["id"])
    assert done["total"] == 1 and done["audience"]["enqueued_at"] is not None


def test_attribute_and_date_operators(engine: sa.Engine) -> None:
    list_id = _seed(engine)
    cases = [
        ([{"field": "attribute", "key": "plan", "op": "ne", "value": "pro"}],
         {"carla", "gus"}),
        ([{"field": "attribute", "key": "country", "op": "not_in", "value": ["ES", "MX"]}],
         {"dan", "fede", "hana"}),
        ([{"field": "attribute", "key": "country", "op": "contains", "value": "X"}],
         {"beto", "gus", "hana"}),
        ([{"field": "attribute", "key": "plan", "op": "missing"}], {"gus"}),
        ([{"field": "attribute", "key": "plan", "op": "exists"},
          {"field": "subscribed", "op": "before", "value": "2000-01-01"}], set()),
        ([{"field": "subscribed", "op": "after", "value": _days_ago(engine, 4)}],
         {"dan", "fede", "gus", "hana"}),
        ([{"field": "subscribed", "op": "before", "value": _days_ago(engine, 30)}],
         {"beto", "eva"}),
    ]
    with engine.connect() as conn:
        for conditions, names in cases:
            checked = segments.validate(conn, conditions)
            expected = {f"{n}@example.org" for n in names}
            got = segments.count(conn, list_id, checked)
            assert got["members"] == len(expected), conditions
    # And the enqueue agrees with the count on one of them.
    with engine.begin() as conn:
        seg = segments.create(conn, list_id, "Not ES/MX", cases[1][0])
    campaign, _ = _send_to(engine, list_id, seg["id"], chunk=3)
    assert _enqueued(engine, campaign["id"]) == {f"{n}@example.org"
                                                  for n in ("dan", "fede", "hana")}


def _days_ago(engine: sa.Engine, days: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT (now() AT TIME ZONE 'UTC' - "
                                        "make_interval(days => :d))::date"),
                                {"d": days}).scalar_one())


def test_bad_conditions_are_answered_by_index_and_field(engine: sa.Engine) -> None:
    bad: list[tuple[Any, str, str]] = [
        ("plan = pro", "conditions", "must be a list"),
        ([{"field": "plan", "op": "eq"}], "conditions[0].field",
         "attribute, subscribed or activity"),
        ([{"field": "attribute", "key": "plan", "op": "LIKE", "value": "x"}],
         "conditions[0].op", "eq, ne, in"),
        ([{"field": "attribute", "op": "eq", "value": "x"}], "conditions[0].key",
         "name the attribute"),
        ([PRO_ES_MX[0], {"field": "attribute", "key": "c", "op": "in", "value": []}],
         "conditions[1].value", "one or more values"),
        ([{"field": "attribute", "key": "c", "op": "eq", "value": "  "}],
         "conditions[0].value", "a value is needed"),
        ([{"field": "subscribed", "op": "after", "value": "2026-02-30"}],
         "conditions[0].value", "a date like"),
        ([{"field": "subscribed", "op": "after", "value": "20260101"}],
         "conditions[0].value", "a date like"),
        ([{"field": "activity", "op": "opened", "value": 0}], "conditions[0].value",
         "from 1 to 3650"),
        ([{"field": "attribute", "key": "c", "op": "eq", "value": "x", "sql": "1=1"}],
         "conditions[0].sql", "unknown part"),
        ([{"field": "attribute", "key": "c", "op": "exists"}] * 21, "conditions",
         "too many"),
    ]
    with engine.connect() as conn:
        for conditions, field, words in bad:
            with pytest.raises(Invalid) as caught:
                segments.validate(conn, conditions)
            assert field in caught.value.fields, (conditions, caught.value.fields)
            assert words in str(caught.value.message) + str(caught.value.fields[field]), \
                (conditions, caught.value.message)


def test_user_text_is_data_never_sql(engine: sa.Engine) -> None:
    """Keys and values that look like SQL are bound parameters: they match nobody and
    change nothing; the engine refuses a stored condition outside its table."""
    list_id = _seed(engine)
    nasty = [{"field": "attribute", "key": "plan'; DROP TABLE subscribers; --", "op": "eq",
              "value": "x' OR '1'='1"},
             {"field": "attribute", "key": "country", "op": "in",
              "value": ["ES') OR true --"]}]
    with engine.connect() as conn:
        for condition in nasty:
            assert segments.count(conn, list_id, segments.validate(conn, [condition])
                                  )["members"] == 0
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers")).scalar_one() == 8
    sql, params = audience.predicate(nasty)
    assert "DROP" not in sql and "OR" not in sql.replace("IS DISTINCT", "")
    assert params == {"seg_k0": nasty[0]["key"], "seg_v0": nasty[0]["value"],
                      "seg_k1": "country", "seg_v1": nasty[1]["value"]}
    for tampered in ({"field": "attribute", "key": "k", "op": "eq) OR (true", "value": "x"},
                     {"field": "s.id > 0 OR true", "op": "eq", "value": "x"}):
        with pytest.raises(audience.BadCondition):
            audience.predicate([tampered])


def test_a_sent_campaign_keeps_the_conditions_it_was_sent_with(engine: sa.Engine) -> None:
    list_id = _seed(engine)
    with engine.begin() as conn:
        segment = segments.create(conn, list_id, "Pro ES/MX", PRO_ES_MX)
        campaign = campaigns.create(conn, {"name": "c", "list_id": list_id, "subject": "Hi",
                                           "segment_id": segment["id"], "text": "Hi"},
                                    default_from="news@example.com")
        campaign = campaigns.send(conn, campaign["id"])
        # Changed after the send was accepted, before any job exists: the send keeps the
        # conditions it was accepted with.
        segments.update(conn, segment["id"], "Everyone pro", PRO_ES_MX[:1])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        frozen = conn.execute(sa.text("SELECT audience_filter FROM broadcasts WHERE id = :b"),
                              {"b": campaign["broadcast_id"]}).scalar_one()
    assert frozen == PRO_ES_MX
    assert _enqueued(engine, campaign["id"]) == {"ana@example.org", "beto@example.org",
                                                 "eva@example.org"}


def test_scheduled_campaigns_start_with_their_segment(engine: sa.Engine) -> None:
    list_id = _seed(engine)
    with engine.begin() as conn:
        segment = segments.create(conn, list_id, "Missing plan", [
            {"field": "attribute", "key": "plan", "op": "missing"}])
        campaign = campaigns.create(conn, {"name": "c", "list_id": list_id, "subject": "Hi",
                                           "segment_id": segment["id"], "text": "Hi"},
                                    default_from="news@example.com")
        conn.execute(sa.text("UPDATE campaigns SET status = 'scheduled', scheduled_at = "
                             "now() - interval '1 second' WHERE id = :id"),
                     {"id": campaign["id"]})
        assert queue.start_due_campaigns(conn) == [campaign["id"]]
        broadcast_id = campaigns.get(conn, campaign["id"])["broadcast_id"]
        queue.enqueue_broadcast(conn, broadcast_id)
    assert _enqueued(engine, campaign["id"]) == {"gus@example.org"}


def test_activity_conditions_read_the_tracking_events(engine: sa.Engine) -> None:
    """Opened/clicked in the last N days read campaign_events, the rows open and click
    tracking (webapp.domain.tracking) records: an open 5 days ago counts for 90 days, one
    200 days ago does not, and a click is not an open."""
    list_id = _seed(engine)
    opened = [{"field": "activity", "op": "opened", "value": 90}]
    with engine.begin() as conn:
        earlier = campaigns.create(conn, {"name": "Earlier", "list_id": list_id,
                                          "subject": "Hi", "text": "Hi"},
                                   default_from="news@example.com")
        conn.execute(sa.text(
            "INSERT INTO campaign_events (campaign_id, job_id, subscriber_id, kind, at) "
            "SELECT :c, 0, id, 'open', now() - make_interval(days => d) "
            "FROM subscribers, (VALUES (5), (200)) AS t(d) WHERE email IN "
            "('ana@example.org', 'dan@example.org') AND (email = 'ana@example.org' OR d = 200)"),
            {"c": earlier["id"]})
        segment = segments.create(conn, list_id, "Openers", opened)
        assert segments.count(conn, list_id, segment["conditions"])["members"] == 1
        quiet = segments.validate(conn, [{"field": "activity", "op": "not_opened",
                                          "value": 90}])
        assert segments.count(conn, list_id, quiet)["members"] == 7
        clicked = segments.validate(conn, [{"field": "activity", "op": "clicked",
                                            "value": 90}])
        assert segments.count(conn, list_id, clicked)["members"] == 0
    campaign, _ = _send_to(engine, list_id, segment["id"])
    assert _enqueued(engine, campaign["id"]) == {"ana@example.org"}


def test_saved_segments_crud_and_campaign_checks(engine: sa.Engine) -> None:
    list_id = _seed(engine)
    with engine.begin() as conn:
        other = int(lists.create_list(conn, "Other")["id"])
        segment = segments.create(conn, list_id, "Pro", PRO_ES_MX[:1])
        with pytest.raises(Conflict):
            segments.create(conn, list_id, "pro", [])  # same name however cased
        with pytest.raises(Invalid):
            segments.create(conn, list_id, "  ", [])
        with pytest.raises(Conflict):  # another list's segment
            campaigns.create(conn, {"name": "c", "list_id": other, "subject": "Hi",
                                    "segment_id": segment["id"], "text": "Hi"},
                             default_from="news@example.com")
        with pytest.raises(NotFound):
            campaigns.create(conn, {"name": "c", "list_id": list_id, "subject": "Hi",
                                    "segment_id": 999999, "text": "Hi"},
                             default_from="news@example.com")
        draft = campaigns.create(conn, {"name": "Draft", "list_id": list_id, "subject": "Hi",
                                        "segment_id": segment["id"], "text": "Hi"},
                                 default_from="news@example.com")
        with pytest.raises(Conflict) as caught:
            segments.delete(conn, segment["id"])
        assert "Draft" in str(caught.value.message)
        campaigns.update(conn, draft["id"], {"name": "Draft", "subject": "Hi", "text": "Hi",
                                             "segment_id": None},
                         default_from="news@example.com")
        segments.delete(conn, segment["id"])
        assert segments.for_list(conn, list_id) == []


# --- API ----------------------------------------------------------------------------------

def test_api_creates_counts_and_sends_to_a_segment(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.conftest import Api

    list_id = _seed(engine)
    api = Api(client, make_user("marketer")["token"])
    r = api.post(f"/lists/{list_id}/segments/count", {"conditions": PRO_ES_MX})
    assert r.status_code == 200 and r.json["audience"]["will_receive"] == 3
    r = api.post(f"/lists/{list_id}/segments", {"name": "Pro ES/MX", "conditions": PRO_ES_MX})
    assert r.status_code == 201, r.json
    segment = r.json
    assert segment["audience"]["will_receive"] == 3 and segment["conditions"] == PRO_ES_MX
    assert api.get(f"/lists/{list_id}/segments").json["segments"][0]["id"] == segment["id"]
    assert api.get(f"/segments/{segment['id']}").json["name"] == "Pro ES/MX"
    r = api.post("/campaigns", {"name": "Spring", "list_id": list_id, "subject": "Hi",
                                "text": "Hi {{ name }}", "segment_id": segment["id"]})
    assert r.status_code == 201 and r.json["segment_id"] == segment["id"]
    sent = api.post(f"/campaigns/{r.json['id']}/send")
    assert sent.status_code == 202
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, sent.json["broadcast_id"])
    assert api.get(f"/campaigns/{r.json['id']}").json["total"] == 3
    # Bad input: JSON errors naming the field (P9).
    r = api.post(f"/lists/{list_id}/segments", {"name": "x", "conditions": [
        {"field": "attribute", "key": "plan", "op": "like", "value": "p%"}]})
    assert r.status_code == 422 and "conditions[0].op" in r.json["error"]["fields"]
    r = api.post(f"/lists/{list_id}/segments", {"name": "x", "conditions": [
        {"field": "activity", "op": "opened", "value": 0}]})
    assert r.status_code == 422 and "conditions[0].value" in r.json["error"]["fields"]
    assert api.post("/lists/999999/segments", {"name": "x"}).status_code == 404
    put = client.put(f"/api/v1/segments/{segment['id']}", headers=api.headers,
                     json={"name": "Renamed", "conditions": []})
    assert put.status_code == 200 and put.json["audience"]["will_receive"] == 8
    assert api.delete(f"/segments/{segment['id']}").status_code == 204
    assert api.get(f"/segments/{segment['id']}").status_code == 404


def test_support_cannot_touch_segments(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.conftest import Api

    list_id = _seed(engine)
    api = Api(client, make_user("support")["token"])
    assert api.post(f"/lists/{list_id}/segments", {"name": "x"}).status_code == 403
    assert api.get(f"/lists/{list_id}/segments").status_code == 403
    support = Browser(client, make_user("support"))
    assert support.get(f"/lists/{list_id}/segments/").status_code == 403


# --- pages ---------------------------------------------------------------------------------

def _form(name: str, rows: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"name": name, "choice": [r[0] for r in rows], "key": [r[1] for r in rows],
            "value": [r[2] for r in rows]}


def test_the_builder_counts_live_saves_and_says_what_is_wrong(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _seed(engine)
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get(f"/lists/{list_id}/segments/")
    assert page.status_code == 200 and 'id="segment-builder"' in page.get_data(as_text=True)
    rows = [("attribute:eq", "plan", "pro"), ("attribute:in", "country", "ES, MX"),
            ("", "", "")]
    live = marketer.post(f"/lists/{list_id}/segments/count", _form("", rows))
    assert 'data-count="3"' in live.get_data(as_text=True)
    bad = marketer.post(f"/lists/{list_id}/segments/count",
                        _form("", [("subscribed:after", "", "last week")]))
    assert "condition 1: a date like 2026-01-31" in bad.get_data(as_text=True)
    r = marketer.post(f"/lists/{list_id}/segments/", _form("Pro ES/MX", rows))
    assert r.status_code == 200 and "Segment “Pro ES/MX” saved." in r.get_data(as_text=True)
    with engine.connect() as conn:
        saved = segments.for_list(conn, list_id)
    assert [s["conditions"] for s in saved] == [PRO_ES_MX]
    # A bad save keeps what was typed and names the condition.
    r = marketer.post(f"/lists/{list_id}/segments/",
                      _form("Broken", [("attribute:eq", "", "pro")]), follow_redirects=False)
    text = r.get_data(as_text=True)
    assert r.status_code == 422 and "condition 1: name the attribute" in text
    assert 'value="Broken"' in text
    # The composer's live count for the list and segment.
    count = marketer.get(f"/segments/audience?list_id={list_id}&segment_id={saved[0]['id']}")
    assert 'data-count="3"' in count.get_data(as_text=True)
    compose = marketer.get(f"/campaigns/new?list={list_id}&segment={saved[0]['id']}")
    assert f'<option value="{saved[0]["id"]}" selected>' in compose.get_data(as_text=True)


def test_the_builder_speaks_spanish(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _seed(engine)
    marketer = Browser(client, make_user("marketer"))
    headers = {"Accept-Language": "es"}
    page = client.get(f"/lists/{list_id}/segments/", headers=headers).get_data(as_text=True)
    assert "Segmentos de Customers" in page and "Guardar segmento" in page
    live = client.post(f"/lists/{list_id}/segments/count", headers=headers, data={
        **_form("", [("subscribed:after", "", "ayer")]), "csrf_token": marketer.token})
    assert "condición 1: una fecha como 2026-01-31" in live.get_data(as_text=True)


def test_conditions_json_round_trips_for_the_page() -> None:
    rows = segments.as_rows(PRO_ES_MX)
    assert rows[1] == {"choice": "attribute:in", "key": "country", "value": "ES, MX"}
    back = segments.from_form([(r["choice"], r["key"], r["value"]) for r in rows])
    assert back == PRO_ES_MX


def test_the_composer_says_when_the_segment_is_another_lists(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _seed(engine)
    with engine.begin() as conn:
        other = int(lists.create_list(conn, "Other")["id"])
        segment = segments.create(conn, list_id, "Pro", PRO_ES_MX[:1])
    marketer = Browser(client, make_user("marketer"))
    values = {"name": "Typed", "list_id": str(other), "subject": "Hi", "text": "Hi",
              "segment_id": str(segment["id"])}
    r = marketer.post("/campaigns/new", values, follow_redirects=False)
    page = r.get_data(as_text=True)
    assert r.status_code == 422 and "belongs to another list" in page
    assert 'value="Typed"' in page  # nothing typed is lost
    count = marketer.get(f"/segments/audience?list_id={other}&segment_id={segment['id']}")
    assert "belongs to another list" in count.get_data(as_text=True)
