"""API: sequences, their steps and enrollments, and events (docs/sequences.md).
Marketers build sequences; support reads a person's enrollments; the team's app posts
events (with the token it sends messages with)."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine, request_connection
from webapp.domain import sequences
from webapp.domain.errors import Invalid
from workers.core.i18n import N_

SEQUENCE_FIELDS = ("name", "trigger_type", "list_id", "trigger_event", "goal_event",
                   "reentry_days", "from_addr", "layout_id", "track_opens", "track_clicks")
STEP_FIELDS = ("type", "subject", "text_body", "html_body", "wait_seconds", "window_start",
               "window_end", "condition", "if_false", "skip")


@bp.get("/sequences")
def list_sequences() -> Response:
    with engine().connect() as conn:
        return answer({"sequences": sequences.list_sequences(conn)})


@bp.post("/sequences")
def create_sequence() -> Response:
    data = body(*SEQUENCE_FIELDS, "steps")
    if not isinstance(data.get("steps", []), list):
        raise Invalid("steps must be an array", fields={"steps": "invalid"})
    with engine().begin() as conn:
        return answer(sequences.create_sequence(conn, data, actor()), 201)


@bp.get("/sequences/<int:sequence_id>")
def get_sequence(sequence_id: int) -> Response:
    with engine().connect() as conn:
        return answer(sequences.get_sequence(conn, sequence_id))


@bp.put("/sequences/<int:sequence_id>")
def update_sequence(sequence_id: int) -> Response:
    data = body(*SEQUENCE_FIELDS)
    with engine().begin() as conn:
        return answer(sequences.update_sequence(conn, sequence_id, data, actor()))


@bp.post("/sequences/<int:sequence_id>/<any(pause, resume, archive):action>")
def sequence_action(sequence_id: int, action: str) -> Response:
    with engine().begin() as conn:
        return answer(sequences.set_status(conn, sequence_id, action, actor()))


@bp.get("/sequences/<int:sequence_id>/funnel")
def sequence_funnel(sequence_id: int) -> Response:
    with engine().connect() as conn:
        return answer(sequences.funnel(conn, sequence_id))


@bp.post("/sequences/<int:sequence_id>/steps")
def add_sequence_step(sequence_id: int) -> Response:
    data = body(*STEP_FIELDS, "position")
    with engine().begin() as conn:
        return answer(sequences.add_step(conn, sequence_id, data, actor(),
                                         position=data.get("position")), 201)


@bp.put("/sequences/<int:sequence_id>/steps/<int:step_id>")
def update_sequence_step(sequence_id: int, step_id: int) -> Response:
    data = body(*STEP_FIELDS)
    with engine().begin() as conn:
        return answer(sequences.update_step(conn, sequence_id, step_id, data, actor()))


@bp.delete("/sequences/<int:sequence_id>/steps/<int:step_id>")
def remove_sequence_step(sequence_id: int, step_id: int) -> Response:
    with engine().begin() as conn:
        moved = sequences.remove_step(conn, sequence_id, step_id, actor())
    return answer({"moved": moved})


@bp.put("/sequences/<int:sequence_id>/order")
def reorder_sequence_steps(sequence_id: int) -> Response:
    data = body("order")
    with engine().begin() as conn:
        return answer({"steps": sequences.reorder_steps(conn, sequence_id, data.get("order"),
                                                        actor())})


@bp.get("/enrollments")
def person_enrollments() -> Response:
    """A person's enrollments (``?email=``), each step's time, job and outcome."""
    with engine().connect() as conn:
        return answer(sequences.person(conn, request.args.get("email", "")))


@bp.post("/events")
def post_event() -> Response:
    """One event (``name``, ``email`` or ``user_id``, ``data``) or many (``events``: a
    list of them), recorded in one statement."""
    data = body("name", "email", "user_id", "data", "events")
    if "events" in data and len(data) > 1:
        raise Invalid(N_("events goes alone: either one event's fields or events"),
                      fields=dict.fromkeys(sorted(set(data) - {"events"}),
                                           N_("unknown field")))
    if "events" in data:
        with engine().begin() as conn:  # all or none of them
            return answer(sequences.record_events(conn, data["events"]), 201)
    # One event is one statement: on the request's connection, committed on its own (an
    # unknown user id writes nothing), without BEGIN and COMMIT round trips.
    with request_connection() as conn:
        return answer(sequences.record_event(conn, data), 201)
