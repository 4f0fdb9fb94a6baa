"""The sequences API: build, edit live, post events, read a person's
enrollments; each role as the role table says; errors name their field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import sqlalchemy as sa

from tests.conftest import Api
from webapp import openapi
from workers.delivery import sequences as engine_sequences


def _response_schema(path: str, method: str, status: int) -> dict[str, Any]:
    document = openapi.document()
    schema = document["paths"][path][method]["responses"][str(status)]["content"][
        "application/json"]["schema"]
    return {**schema, "components": document["components"]}


def _check(answer: Any, path: str, method: str, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.get_json()
    data: dict[str, Any] = answer.get_json()
    jsonschema.validate(data, _response_schema(path, method, status),
                        cls=jsonschema.Draft202012Validator)
    return data


def test_build_post_events_and_read_a_person(api: Api, client: Any, engine: sa.Engine,
                                             make_user: Callable[..., dict[str, Any]]
                                             ) -> None:
    seq = _check(api.post("/sequences", {
        "name": "Trial", "trigger_type": "event", "trigger_event": "trial_started",
        "goal_event": "purchased",
        "steps": [{"type": "email", "subject": "Hi {{ data.plan }}", "text_body": "1"},
                  {"type": "wait", "wait_seconds": 3600, "window_start": 9,
                   "window_end": 17},
                  {"type": "email", "subject": "Still there?", "text_body": "2"}]}),
        "/sequences", "post", 201)
    assert [s["type"] for s in seq["steps"]] == ["email", "wait", "email"]
    event = _check(api.post("/events", {"email": "Ann@Example.org", "name": "trial_started",
                                        "user_id": "42", "data": {"plan": "pro"}}),
                   "/events", "post", 201)
    assert len(event["enrolled"]) == 1
    with engine.begin() as conn:
        engine_sequences.advance(conn)
    person = _check(api.get("/enrollments?email=ann@example.org"), "/enrollments", "get",
                    200)
    [enrollment] = person["enrollments"]
    assert enrollment["status"] == "active" and enrollment["at_position"] == 3
    assert [v["outcome"] for v in enrollment["visits"]] == ["sent", "waited"]
    assert enrollment["visits"][0]["job_id"] is not None
    goal = _check(api.post("/events", {"user_id": "42", "name": "purchased"}),
                  "/events", "post", 201)
    assert goal["exited"] == [enrollment["id"]]
    funnel = _check(api.get(f"/sequences/{seq['id']}/funnel"), "/sequences/{id}/funnel",
                    "get", 200)
    assert [s["entered"] for s in funnel["steps"]] == [1, 1, 0]
    assert funnel["enrollments"] == {"goal": 1}
    # Live edits.
    step = _check(api.post(f"/sequences/{seq['id']}/steps",
                           {"type": "email", "subject": "First!", "text_body": "0",
                            "position": 1}), "/sequences/{id}/steps", "post", 201)
    assert step["position"] == 1
    order = [s["id"] for s in api.get(f"/sequences/{seq['id']}").get_json()["steps"]]
    reordered = api.client.put(f"/api/v1/sequences/{seq['id']}/order",
                               json={"order": order[::-1]}, headers=api.headers)
    assert reordered.status_code == 200
    assert [s["id"] for s in reordered.get_json()["steps"]] == order[::-1]
    assert _check(api.post(f"/sequences/{seq['id']}/pause"), "/sequences/{id}/pause",
                  "post", 200)["status"] == "paused"
    # Roles: support reads a person and posts events, but does not build.
    support = Api(client, make_user("support")["token"])
    assert support.get("/enrollments?email=ann@example.org").status_code == 200
    assert support.post("/sequences", {"name": "x"}).status_code == 403
    marketer = Api(client, make_user("marketer")["token"])
    assert marketer.post("/events", {"email": "a@example.org", "name": "x"}).status_code == 403


def test_errors_name_their_field(api: Api) -> None:
    cases = [
        ({"name": "x", "trigger_type": "list_add"}, "list_id"),
        ({"name": "x", "trigger_type": "sometimes"}, "trigger_type"),
        ({"name": "x", "trigger_type": "event", "trigger_event": "bad name!"},
         "trigger_event"),
        ({"name": "x", "trigger_type": "event", "trigger_event": "e",
          "steps": [{"type": "email", "subject": "{{ broken", "text_body": "t"}]},
         "subject"),
        ({"name": "x", "trigger_type": "event", "trigger_event": "e",
          "steps": [{"type": "wait", "wait_seconds": -1}]}, "wait_seconds"),
        ({"name": "x", "trigger_type": "event", "trigger_event": "e", "colour": "red"},
         "colour"),
        # Schemathesis: a step that is not an object was a 500.
        ({"name": "x", "trigger_type": "event", "trigger_event": "e",
          "steps": [[None, None]]}, "steps"),
        ({"name": "x", "trigger_type": "event", "trigger_event": "e",
          "steps": [{"type": "wait", "wait_seconds": 60, "colour": "red"}]}, "colour"),
    ]
    for payload, field in cases:
        answer = api.post("/sequences", payload)
        assert answer.status_code == 422, (payload, answer.get_json())
        assert field in answer.get_json()["error"]["fields"], (payload, answer.get_json())
    assert api.post("/events", {"name": "x"}).status_code == 422
    unknown = api.post("/events", {"user_id": "nobody", "name": "x"})
    assert unknown.status_code == 404 and "user_id" in unknown.get_json()["error"]["fields"]
    assert api.get("/enrollments?email=nobody@example.org").status_code == 404
    assert api.get("/sequences/999").status_code == 404


def test_tracking_flags_are_set_and_changed_through_the_api(api: Api) -> None:
    """The two tracking flags the schema documents are accepted on create and on update."""
    seq = _check(api.post("/sequences", {
        "name": "Tracked", "trigger_type": "event", "trigger_event": "signed_up",
        "track_opens": True, "track_clicks": False}), "/sequences", "post", 201)
    assert (seq["track_opens"], seq["track_clicks"]) == (True, False)
    changed = api.client.put(f"/api/v1/sequences/{seq['id']}",
                             json={"track_opens": False, "track_clicks": True},
                             headers=api.headers)
    assert changed.status_code == 200, changed.get_json()
    assert (changed.get_json()["track_opens"], changed.get_json()["track_clicks"]) == (
        False, True)
    refused = api.client.put(f"/api/v1/sequences/{seq['id']}", json={"track_opens": "yes"},
                             headers=api.headers)
    assert refused.status_code == 422
    assert "track_opens" in refused.get_json()["error"]["fields"]
