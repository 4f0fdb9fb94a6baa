"""The *Transactional* page (docs/design.md §21, admins): every kind with its class and last-24 h
numbers, a kind editor (sandboxed templates, checked when saved), a preview with sample
``data``/``event`` shown in a sandboxed frame, and a test send."""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.blueprints.campaigns import PREVIEW_CSP
from webapp.context import actor, config, engine
from webapp.domain import kinds, queue_reads
from webapp.domain.errors import DomainError, Invalid
from webapp.domain.fields import whole_number
from webapp.i18n import label, localize
from workers.building.kinds import CLASSES, all_kinds
from workers.core.i18n import N_

bp = Blueprint("transactional", __name__, url_prefix="/transactional")


@bp.get("/")
def index() -> str:
    with engine().connect() as conn:
        specs = all_kinds(conn)
        stats = queue_reads.kind_stats(conn, [k.name for k in specs])
    return render_template("transactional/index.html", kinds=specs, stats=stats,
                           config=config())


def _json_field(name: str, raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise Invalid(N_("%(field)s is not valid JSON: %(why)s", field=name, why=str(exc)),
                      fields={name: N_("not valid JSON: %(why)s", why=str(exc))}) from None


def _schedule_field(raw: str) -> list[int] | str | None:
    text = raw.strip()
    if not text:
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        return text  # refused with a clear message by parse_kind


def _int_field(raw: str) -> int | str | None:
    text = raw.strip()
    if not text:
        return None
    number = whole_number(text)
    return number if number is not None else text


def _form_body(builtin: bool) -> dict[str, Any]:
    """The editor's form as a ``PUT /kinds`` body (so both validate the same way)."""
    form = request.form
    body: dict[str, Any] = {
        "class": form.get("class", ""), "description": form.get("description", ""),
        "subject": form.get("subject", ""), "text": form.get("text", ""),
        "html": form.get("html", ""), "active": builtin or form.get("active") == "on",
        "retry_schedule": _schedule_field(form.get("retry_schedule", "")),
        "resend_cooldown": _int_field(form.get("resend_cooldown", "")),
        "dedupe_window": _int_field(form.get("dedupe_window", "")),
    }
    errors: dict[str, str] = {}
    for field in ("sample_data", "sample_event"):
        try:
            body[field] = _json_field(field, form.get(field, ""))
        except Invalid as exc:
            errors.update(exc.fields)
    if errors:
        raise Invalid(N_("the sample data is not valid JSON"), fields=errors)
    if not builtin:
        for field in ("retry_schedule", "resend_cooldown", "dedupe_window"):
            if body[field] is None:
                body.pop(field)  # keep the current value (or the class default)
    elif body["dedupe_window"] is None:
        body["dedupe_window"] = 0
    return body


_FIELD_LABELS = {"retry_schedule": lambda: _("Retry schedule"),
                 "resend_cooldown": lambda: _("Resend cooldown"),
                 "dedupe_window": lambda: _("Dedupe window")}


def _shown(value: Any) -> str:
    """A timing as the form shows it (seconds; a schedule comma-separated)."""
    if value is None:
        return _("the setting's default")
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _values(conn: Any, name: str) -> dict[str, Any]:
    spec = kinds.get(conn, name)
    view = kinds.as_json(conn, spec)
    return {**view, "retry_schedule": ", ".join(map(str, view["retry_schedule"] or [])),
            "resend_cooldown": "" if view["resend_cooldown"] is None
            else view["resend_cooldown"],
            "sample_data": json.dumps(view["sample_data"], indent=2),
            "sample_event": json.dumps(view["sample_event"], indent=2)}


def _editor(values: dict[str, Any], *, name: str | None, error: DomainError | None = None,
            status: int = 200) -> tuple[str, int]:
    return render_template("transactional/edit.html", values=values, name=name,
                           error=error, classes=CLASSES, config=config(),
                           class_defaults=kinds.DEFAULTS), status


@bp.get("/new")
def new() -> tuple[str, int]:
    # Retry schedule, cooldown and dedupe window start empty: saved empty, they take the
    # chosen class's defaults (a critical kind must not get a lifecycle kind's day-long
    # dedupe window because the form was filled for another class).
    return _editor({"class": "lifecycle", "active": True, "builtin": False,
                    "retry_schedule": "", "resend_cooldown": "", "dedupe_window": "",
                    "sample_event": json.dumps(kinds.SAMPLE_EVENT, indent=2),
                    "sample_data": "{}"}, name=None)


@bp.get("/kinds/<name>")
def edit(name: str) -> tuple[str, int]:
    with engine().connect() as conn:
        return _editor(_values(conn, name), name=name)


@bp.post("/kinds")
@bp.post("/kinds/<name>")
def save(name: str | None = None) -> Response | tuple[str, int]:
    target = name or request.form.get("name", "").strip()
    values = {**request.form.to_dict(), "name": target, "active":
              request.form.get("active") == "on", "builtin": False}
    try:
        with engine().begin() as conn:
            builtin = bool(name) and kinds.get(conn, target).builtin
            values["builtin"] = builtin
            kind, created = kinds.parse_kind(conn, target, _form_body(builtin))
            if name is None and not created:
                raise Invalid(N_("a kind called %(name)s already exists", name=target),
                              fields={"name": N_("already exists")})
            kinds.save(conn, kind, actor=actor(), created=created)
    except DomainError as exc:
        return _editor(values, name=name, error=exc, status=exc.status)
    flash(_("Saved kind %(name)s.", name=target), "success")
    if kind.class_changes:
        flash(_("The class is now %(cls)s, so its defaults apply: %(changes)s.",
                cls=label(kind.kind_class), changes="; ".join(
                    f"{_FIELD_LABELS[f]()}: {_shown(c['from'])} → {_shown(c['to'])}"
                    for f, c in kind.class_changes.items())), "success")
    return redirect(url_for("transactional.edit", name=target), 303)


def _preview_document(rendered: Any, error: DomainError | None) -> Response:
    page = render_template("transactional/preview.html", rendered=rendered, error=error)
    response = Response(page, mimetype="text/html")
    response.headers["Content-Security-Policy"] = PREVIEW_CSP
    response.headers["X-Frame-Options"] = "SAMEORIGIN"
    return response


# The preview renders in a sandboxed frame (unique origin, no scripts): the saved kind with
# its sample data (GET), or the editor's unsaved templates and samples (POST from the
# editor's Preview button, targeted at the frame).
@bp.route("/kinds/<name>/preview", methods=["GET", "POST"])
def preview(name: str) -> Response:
    error: DomainError | None = None
    rendered = None
    try:
        with engine().connect() as conn:
            spec = kinds.get(conn, name)
            if request.method == "POST":
                body = _form_body(spec.builtin)
                kind, _created = kinds.parse_kind(conn, name, body)
                rendered = kinds.render(kind, kind.sample_data, kind.sample_event)
            else:
                data, event = kinds.sample_of(conn, name)
                rendered = kinds.render(spec, data, event)
    except DomainError as exc:
        error = exc
    return _preview_document(rendered, error)


@bp.post("/kinds/<name>/test")
def test_send(name: str) -> Response:
    email = request.form.get("email", "")
    try:
        with engine().begin() as conn:
            data, event = kinds.sample_of(conn, name)
            kinds.test_send(conn, name, email, data, event, actor=actor())
    except DomainError as exc:
        flash(_("No test was sent: %(why)s", why=localize(exc.message)), "error")
    else:
        flash(_("Test message of %(name)s queued to %(email)s, with the sample data; it "
                "arrives with “[Test]” before the subject.", name=name, email=email.strip()),
              "success")
    return redirect(url_for("transactional.edit", name=name), 303)
