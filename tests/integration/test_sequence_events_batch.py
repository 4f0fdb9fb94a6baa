"""Events through the API in one statement, one or many per request (docs/sequences.md):
a batch finds or creates each address once, knows a user id given with an email earlier in
the same batch, enters each person once, ends the goal's enrollments, and refuses as a
whole (nothing recorded) an event whose user id is unknown; statements are counted."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from tests.conftest import Api
from tests.integration.test_sequences_api import _check


def _count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def test_a_batch_of_events_in_one_statement(api: Api, engine: sa.Engine, app: Any) -> None:
    _check(api.post("/sequences", {
        "name": "Trial", "trigger_type": "event", "trigger_event": "trial",
        "goal_event": "paid",
        "steps": [{"type": "email", "subject": "Hi", "text_body": "1"}]}),
        "/sequences", "post", 201)
    # Ann is already in the trial (an open enrollment) before the batch.
    first = _check(api.post("/events", {"email": "ann@example.org", "name": "trial"}),
                   "/events", "post", 201)
    [ann_enrollment] = first["enrolled"]
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    batch = [{"email": "Bob@Example.org", "user_id": "u-7", "name": "trial",
              "data": {"plan": "pro"}},
             {"user_id": "u-7", "name": "trial"},  # Bob again: entered once
             {"email": "bob@example.org", "name": "clicked"},
             {"email": "ann@example.org", "name": "paid"},  # Ann's goal: her trial ends
             {"email": "cy@example.org", "name": "trial"}]
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        answer = _check(api.post("/events", {"events": batch}), "/events", "post", 201)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    # Besides the token's check, the batch was one statement.
    assert len([s for s in statements if "sequence_enrollments" in s]) == 1, statements
    assert [e["name"] for e in answer["events"]] == [
        "trial", "trial", "clicked", "paid", "trial"]
    bob = answer["events"][0]["subscriber_id"]
    assert answer["events"][1]["subscriber_id"] == bob == answer["events"][2]["subscriber_id"]
    assert sorted(e["subscriber_id"] for e in answer["enrolled"]) == sorted(
        [bob, answer["events"][4]["subscriber_id"]])
    assert answer["exited"] == [ann_enrollment["enrollment_id"]]
    assert _count(engine, "SELECT count(*) FROM subscribers WHERE lower(email) = "
                          "'bob@example.org'") == 1
    assert _count(engine, "SELECT count(*) FROM events") == 6
    assert _count(engine, "SELECT count(*) FROM sequence_enrollments e JOIN subscribers s "
                          "ON s.id = e.subscriber_id WHERE lower(s.email) = 'bob@example.org' "
                          "AND e.data = '{\"plan\": \"pro\"}'") == 1

    # An unknown user id refuses the whole batch, naming the event; nothing is recorded.
    refused = api.post("/events", {"events": [
        {"email": "dee@example.org", "name": "trial"}, {"user_id": "nobody", "name": "x"}]})
    assert refused.status_code == 404
    assert refused.get_json()["error"]["fields"] == {"events[1].user_id": "unknown"}
    assert _count(engine, "SELECT count(*) FROM events") == 6
    assert _count(engine, "SELECT count(*) FROM subscribers WHERE email = "
                          "'dee@example.org'") == 0
    # A bad event is a 422 naming it; a batch goes alone; at most 1,000.
    bad = api.post("/events", {"events": [{"name": "trial"}, {"email": "e@example.org",
                                                              "name": "bad name"}]})
    assert bad.status_code == 422 and "events[0].email" in bad.get_json()["error"]["fields"]
    mixed = api.post("/events", {"events": [{"email": "e@example.org", "name": "x"}],
                                 "name": "x"})
    assert mixed.status_code == 422
    too_many = api.post("/events", {"events": [{"email": "e@example.org", "name": "x"}]
                                    * 1001})
    assert too_many.status_code == 422
    assert _count(engine, "SELECT count(*) FROM events") == 6
