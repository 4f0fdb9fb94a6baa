"""The support console (docs/design.md §21): find a user, see every transactional email of every
kind with its attempts, why it failed and the event that caused it, resend per kind within
that kind's cooldown, release or drop held ones."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.context import actor, config, engine
from webapp.domain import messages, verifications
from webapp.domain.errors import Conflict, NotFound, TooMany
from webapp.i18n import localize

bp = Blueprint("support", __name__, url_prefix="/support")


@bp.get("/")
def index() -> str | Response:
    q = request.args.get("q", "").strip()
    with engine().connect() as conn:
        results = verifications.search(conn, q)
    if len(results) == 1:
        return redirect(url_for("support.user", user_ref=results[0]["user_ref"]))
    return render_template("support/index.html", q=q, results=results)


@bp.get("/users/<path:user_ref>")
def user(user_ref: str) -> str:
    with engine().connect() as conn:
        sections = messages.user_overview(conn, config(), user_ref)
    template = "partials/_support_jobs.html" if request.args.get("fragment") == "jobs" \
        else "support/user.html"
    return render_template(template, sections=sections, user_ref=user_ref,
                           labels=verifications.STATUS_LABELS,
                           timestamp=verifications.timestamp)


@bp.post("/users/<path:user_ref>/resend")
def resend(user_ref: str) -> Response:
    kind = request.form.get("kind", "").strip() or verifications.KIND
    try:
        with engine().begin() as conn:
            job, reused = messages.resend(conn, config(), kind, user_ref, actor=actor())
    except (TooMany, Conflict, NotFound) as exc:
        flash(localize(exc.message), "error")
    else:
        flash(_("Resent to %(email)s.", email=job["email"]) if not reused else
              _("The waiting email to %(email)s will be sent right away (no second copy was "
                "added).", email=job["email"]), "success")
    return redirect(url_for("support.user", user_ref=user_ref))


def _held_action(job_id: int, release: bool) -> Response:
    user_ref = request.form.get("user_id", "")
    try:
        with engine().begin() as conn:
            act = verifications.release if release else verifications.drop
            job = act(conn, job_id, actor=actor())
    except Conflict as exc:
        flash(localize(exc.message), "error")
        user_ref = str(exc.extra.get("user_ref") or user_ref)
    except NotFound as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("support.index"))
    else:
        user_ref = job["user_ref"]
        flash(_("Released: the email to %(email)s will be sent now.", email=job["email"])
              if release else
              _("Dropped: the email to %(email)s will not be sent.", email=job["email"]),
              "success")
    if not user_ref:
        return redirect(url_for("support.index"))
    return redirect(url_for("support.user", user_ref=user_ref))


@bp.post("/jobs/<int:job_id>/release")
def release(job_id: int) -> Response:
    return _held_action(job_id, release=True)


@bp.post("/jobs/<int:job_id>/drop")
def drop(job_id: int) -> Response:
    return _held_action(job_id, release=False)
