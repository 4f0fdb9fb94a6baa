"""Sequences in the browser (docs/sequences.md): the list, the builder with its
live per-step funnel (HTMX), and a person's enrollments for support ("why did they get step
3 and not step 4")."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import pgettext
from werkzeug.wrappers import Response

from webapp.context import actor, engine
from webapp.domain import lists, sequences
from webapp.domain.errors import DomainError
from webapp.domain.fields import whole_number
from webapp.i18n import localize

bp = Blueprint("sequences", __name__, url_prefix="/sequences")


@bp.app_template_filter("sequence_reason")
def sequence_reason(word: str | None) -> str:
    """A status, exit reason or step outcome of a sequence, in the reader's language."""
    words = {
        # A sequence and an enrollment (una inscripción) are feminine in Spanish: activa.
        "active": pgettext("sequence", "active"), "paused": _("paused"), "archived": _("archived"),
        "done": _("done"), "exited": _("exited"), "goal": _("reached the goal"),
        "unsubscribed": _("unsubscribed"), "hard_bounce": _("hard bounce"),
        "suppressed": _("suppressed"), "left_list": _("left the list"),
        "condition": _("a condition did not hold"), "deleted": _("deleted"),
        "sent": _("sent"), "waited": _("waited"), "continued": _("condition held"),
        "skipped": _("skipped ahead"),
    }
    return words.get(word or "", word or "")

SEQUENCE_FORM = ("name", "trigger_type", "list_id", "trigger_event", "goal_event",
                 "reentry_days", "from_addr")
STEP_FORM = ("type", "subject", "text_body", "html_body", "wait_seconds", "window_start",
             "window_end", "if_false", "skip")


NUMBERS = ("wait_seconds", "window_start", "window_end", "skip", "list_id", "reentry_days")


def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    """The form's whole numbers as numbers (anything else stays text: the domain check
    then names the field)."""
    for key in NUMBERS:
        if isinstance(values.get(key), str):
            number = whole_number(values[key].strip())
            values[key] = number if number is not None else values[key]
    return values


def _step_values() -> dict[str, Any]:
    form = request.form
    values: dict[str, Any] = _numbers({k: form.get(k) for k in STEP_FORM
                                       if form.get(k) not in (None, "")})
    test = form.get("condition_test")
    if test == "attribute":
        values["condition"] = {"test": "attribute", "attribute": form.get("attribute", ""),
                               "value": form.get("value", "")}
    elif test == "event":
        values["condition"] = {"test": "event", "event": form.get("event", "")}
    elif test in ("opened", "clicked"):
        values["condition"] = {"test": test}
    unit = whole_number(form.get("wait_unit")) or 1
    if isinstance(values.get("wait_seconds"), int):
        values["wait_seconds"] *= unit
    return values


def _index(values: dict[str, Any], error: DomainError | None = None) -> tuple[str, int]:
    with engine().connect() as conn:
        every = sequences.list_sequences(conn)
        all_lists = lists.all_lists(conn)
    return render_template("sequences/index.html", sequences=every, lists=all_lists,
                           values=values, error=error), 422 if error else 200


@bp.get("/")
def index() -> tuple[str, int]:
    return _index({"trigger_type": "list_add"})


@bp.post("/")
def create() -> Response | tuple[str, int]:
    values = {k: request.form.get(k, "") for k in SEQUENCE_FORM}
    data = _numbers({k: v for k, v in values.items() if v != ""})
    data.update(_tracking_values())
    try:
        with engine().begin() as conn:
            created = sequences.create_sequence(conn, data, actor())
    except DomainError as exc:
        return _index(values, exc)
    flash(_("Sequence “%(name)s” created. Add its steps below.", name=created["name"]),
          "success")
    return redirect(url_for("sequences.detail", sequence_id=created["id"]), 303)


def _detail(sequence_id: int, error: DomainError | None = None, failed_step: Any = None,
            values: dict[str, Any] | None = None) -> tuple[str, int]:
    with engine().connect() as conn:
        seq = sequences.get_sequence(conn, sequence_id)
        funnel = sequences.funnel(conn, sequence_id)
        list_name = None
        if seq["list_id"] is not None:
            list_name = lists.get_list(conn, seq["list_id"])["name"]
    return render_template("sequences/detail.html", seq=seq, funnel=funnel,
                           list_name=list_name, error=error, failed_step=failed_step,
                           values=values or {}), 422 if error else 200


@bp.get("/<int:sequence_id>")
def detail(sequence_id: int) -> tuple[str, int]:
    if request.args.get("fragment") == "funnel":
        with engine().connect() as conn:
            seq = sequences.get_sequence(conn, sequence_id)
            funnel = sequences.funnel(conn, sequence_id)
        return render_template("sequences/_funnel.html", seq=seq, funnel=funnel), 200
    return _detail(sequence_id)


@bp.post("/<int:sequence_id>/steps")
def add_step(sequence_id: int) -> Response | tuple[str, int]:
    values = _step_values()
    try:
        with engine().begin() as conn:
            sequences.add_step(conn, sequence_id, values, actor())
    except DomainError as exc:
        return _detail(sequence_id, exc, "new", dict(request.form))
    flash(_("Step added."), "success")
    return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)


@bp.post("/<int:sequence_id>/steps/<int:step_id>")
def edit_step(sequence_id: int, step_id: int) -> Response | tuple[str, int]:
    action = request.form.get("action", "save")
    try:
        with engine().begin() as conn:
            if action == "remove":
                moved = sequences.remove_step(conn, sequence_id, step_id, actor())
                flash(_("Step removed; %(n)s enrollment(s) waiting at it moved to the next "
                        "step.", n=moved), "success")
            elif action in ("up", "down"):
                order = [s["id"] for s in sequences.steps_of(conn, sequence_id)]
                i = order.index(step_id) if step_id in order else -1
                j = i - 1 if action == "up" else i + 1
                if i >= 0 and 0 <= j < len(order):
                    order[i], order[j] = order[j], order[i]
                    sequences.reorder_steps(conn, sequence_id, order, actor())
            else:
                sequences.update_step(conn, sequence_id, step_id, _step_values(), actor())
                flash(_("Step saved: messages not sent yet use it."), "success")
    except DomainError as exc:
        return _detail(sequence_id, exc, step_id, dict(request.form))
    return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)


def _tracking_values() -> dict[str, bool]:
    """The two tracking checkboxes (absent: off)."""
    return {k: request.form.get(k) in ("on", "true", "1")
            for k in ("track_opens", "track_clicks")}


@bp.post("/<int:sequence_id>/tracking")
def tracking(sequence_id: int) -> Response:
    try:
        with engine().begin() as conn:
            sequences.update_sequence(conn, sequence_id, _tracking_values(), actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)
    flash(_("Tracking saved: messages built from now on follow it."), "success")
    return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)


@bp.post("/<int:sequence_id>/<any(pause, resume, archive):action>")
def act(sequence_id: int, action: str) -> Response:
    try:
        with engine().begin() as conn:
            sequences.set_status(conn, sequence_id, action, actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)
    flash({"pause": _("Sequence paused: due steps wait until you resume it."),
           "resume": _("Sequence resumed."),
           "archive": _("Sequence archived: its open enrollments ended.")}[action], "success")
    return redirect(url_for("sequences.detail", sequence_id=sequence_id), 303)


@bp.get("/people")
def people() -> tuple[str, int]:
    email = request.args.get("email", "").strip()
    found = None
    error = None
    if email:
        try:
            with engine().connect() as conn:
                found = sequences.person(conn, email)
        except DomainError as exc:
            error = exc
    return render_template("sequences/people.html", email=email, found=found,
                           error=error), 404 if error and error.status == 404 else \
        (422 if error else 200)
