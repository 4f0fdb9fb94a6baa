"""Admin pages (docs/design.md §22, §23, §36): the suppression list, bounce review and its
rules, the audit log, users and API tokens.
Views parse the form, call one domain function and render; the domain writes the audit
log in the same transaction as the change."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import ngettext
from werkzeug.wrappers import Response

from webapp import access
from webapp.auth import step_up
from webapp.blueprints.api import answer
from webapp.context import actor, engine
from webapp.domain import (
    audit,
    bounce_review,
    personal_data,
    second_factor,
    submissions,
    suppressions,
    users,
)
from webapp.domain.csv_export import SafeWriter
from webapp.domain.errors import DomainError, Invalid
from webapp.domain.fields import whole_number
from webapp.form_memory import remember, show_once, take_shown
from webapp.i18n import bounce_reason as label_bounce
from webapp.i18n import label, localize, num
from webapp.models import ROLES, SUPPRESSION_REASONS
from workers.core.i18n import N_

bp = Blueprint("admin", __name__, url_prefix="/admin")

# The audit log's "What" filter: an exact action or a prefix ending in ".".
AUDIT_ACTIONS = {"user.login": "logins", "user.login_failed": "failed logins",
                 "suppression.": "suppression changes", "job.": "job retries and dismissals",
                 "user.": "user changes (and logins)", "token.": "API token changes",
                 "campaign.": "campaign actions", "verification.": "verification emails",
                 "list.": "list changes"}


# --- suppressions ------------------------------------------------------------------------

def _suppression_args() -> dict[str, Any]:
    return {k: v for k in ("q", "reason") if (v := request.values.get(k, "").strip())}


def suppressions_page(pasted: str = "", report: dict[str, object] | None = None) -> str:
    args = _suppression_args()
    with engine().connect() as conn:
        page = suppressions.search(conn, query=args.get("q"), reason=args.get("reason"),
                                   after=request.args.get("after"))
        total = suppressions.count(conn)
        matching = suppressions.count(conn, query=args.get("q"), reason=args.get("reason")) \
            if args else total
    return render_template("admin/suppressions.html", page=page, args=args, total=total,
                           matching=matching,
                           reasons=SUPPRESSION_REASONS, pasted=pasted, report=report,
                           first_page=not request.args.get("after"))


bp.add_url_rule("/suppressions", endpoint="suppressions", view_func=suppressions_page,
                methods=["GET"])


@bp.get("/suppressions/export.csv")
def export_suppressions() -> Response:
    """The entries matching the page's search and reason, as CSV (streamed)."""
    args = _suppression_args()
    if args.get("reason"):
        # Checked before the first byte is streamed: an unknown reason is a clear 422,
        # not an error in the middle of a download.
        suppressions.check_reason(args["reason"])
    eng = engine()

    def stream() -> Iterator[str]:
        writer = SafeWriter()
        with eng.connect() as conn:
            for row in suppressions.export_rows(conn, query=args.get("q"),
                                                reason=args.get("reason")):
                writer.row(row)
                yield writer.take()

    response = Response(stream(), mimetype="text/csv")
    response.headers["Content-Disposition"] = 'attachment; filename="suppressions.csv"'
    return response


@bp.post("/suppressions/add")
def add_suppressions() -> str | Response:
    text = request.form.get("emails", "")
    try:
        with engine().begin() as conn:
            report = suppressions.add_many(conn, text, reason=request.form.get("reason",
                                                                               "manual"),
                                           note=request.form.get("note", ""), actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
        return suppressions_page(pasted=text)
    if report["errors"]:
        # Keep the rejected lines in the box to fix them; everything valid is saved (P9).
        bad = "\n".join(str(e["value"]) for e in report["errors"])
        return suppressions_page(pasted=bad, report=report)
    flash(_added_message(report), "success")
    return redirect(url_for("admin.suppressions"))


def _added_message(report: dict[str, list[object]]) -> str:
    added, already = len(report["added"]), len(report["already"])
    # ngettext's third argument is its own "num": the formatted count goes in as "count".
    message = ngettext("Suppressed %(count)s address.", "Suppressed %(count)s addresses.",
                       added, count=num(added))
    if already:
        message += " " + ngettext("%(count)s was already on the list.",
                                  "%(count)s were already on the list.", already,
                                  count=num(already))
    return message


@bp.post("/suppressions/clear")
def clear_suppressions() -> Response:
    only = request.form.get("only")
    emails = [only] if only else request.form.getlist("email")
    note = request.form.get("note", "").strip()
    back = url_for("admin.suppressions", **_suppression_args())
    if not note:
        flash(_("Say why in the note: clearing a suppression is recorded in the audit log "
                "with its note."), "error")
        return redirect(back)
    try:
        with engine().begin() as conn:
            cleared = suppressions.clear(conn, emails, note, actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
        return redirect(back)
    if cleared:
        flash(_("Cleared %(emails)s: the next campaign includes them again.",
                emails=", ".join(cleared[:10]) + ("…" if len(cleared) > 10 else "")),
              "success")
    else:
        flash(_("Nothing to clear: those addresses were not on the list any more."), "error")
    return redirect(back)


# --- bounce review (docs/design.md §36) ---------------------------------------------------

def _review_args() -> dict[str, Any]:
    return {k: v for k in ("show", "reason", "q") if (v := request.values.get(k, "").strip())}


def bounces_page() -> str | tuple[str, int]:
    args = _review_args()
    try:
        with engine().connect() as conn:
            page = bounce_review.events(conn, shown=args.get("show"), reason=args.get("reason"),
                                        query=args.get("q"), after=request.args.get("after"))
            rules = bounce_review.rules(conn)
    except Invalid as exc:
        flash(localize(exc.message), "error")
        with engine().connect() as conn:
            page, rules = bounce_review.events(conn), bounce_review.rules(conn)
        args = {}
    return render_template("admin/bounces.html", page=page, rules=rules, args=args,
                           shown=bounce_review.SHOWN, reasons=bounce_review.VOCABULARY,
                           first_page=not request.args.get("after"))


bp.add_url_rule("/bounces", endpoint="bounces", view_func=bounces_page, methods=["GET"])


@bp.post("/bounces/<int:event_id>/correct")
def correct_bounce(event_id: int) -> Response:
    back = url_for("admin.bounces", **_review_args())
    try:
        with engine().begin() as conn:
            done = bounce_review.correct(conn, event_id, request.form.get("reason", ""),
                                         request.form.get("pattern", ""),
                                         request.form.get("note", ""), actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(back)
    message = _("Corrected: this bounce now reads “%(reason)s”, and so will every later "
                "bounce whose reply holds the pattern.", reason=label_bounce(done.reason))
    if done.suppression == "lifted":
        message += " " + _("Its suppression was lifted.")
    elif done.suppression == "added":
        message += " " + _("The address is suppressed now.")
    flash(message, "success")
    return redirect(back + f"#event-{event_id}")


@bp.post("/bounce-rules/add")
def add_bounce_rule() -> Response:
    try:
        with engine().begin() as conn:
            bounce_review.add_rule(conn, request.form.get("pattern", ""),
                                   request.form.get("reason", ""),
                                   request.form.get("note", ""), actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("admin.bounces") + "#bounce-rules")
    flash(_("Rule kept: later bounces whose reply holds the pattern read as it says."),
          "success")
    return redirect(url_for("admin.bounces") + "#bounce-rules")


@bp.post("/bounce-rules/<int:rule_id>/delete")
def delete_bounce_rule(rule_id: int) -> Response:
    try:
        with engine().begin() as conn:
            bounce_review.delete_rule(conn, rule_id, actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
    else:
        flash(_("Rule deleted: later bounces are read by the reader alone again."), "success")
    return redirect(url_for("admin.bounces") + "#bounce-rules")


@bp.get("/bounce-rules/export.json")
def export_bounce_rules() -> Response:
    with engine().connect() as conn:
        rules = bounce_review.export(conn)
    response = answer({"rules": rules})
    response.headers["Content-Disposition"] = 'attachment; filename="bounce-rules.json"'
    return response


# --- audit log ---------------------------------------------------------------------------

def _day(raw: str, field: str, *, end: bool = False) -> datetime | None:
    if not raw:
        return None
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise Invalid(N_("%(field)s must be a date (YYYY-MM-DD)", field=field),
                      fields={field: N_("invalid")}) from None
    return datetime.combine(day + timedelta(days=1) if end else day, time(), UTC)


def audit_log() -> str:
    args = {k: v for k in ("actor", "action", "target", "from", "to")
            if (v := request.args.get(k, "").strip())}
    before = request.args.get("before", "")
    with engine().connect() as conn:
        rows = audit.entries(conn, actor=args.get("actor"), action=args.get("action"),
                             target=args.get("target", "").lower() or None,
                             since=_day(args.get("from", ""), "from"),
                             until=_day(args.get("to", ""), "to", end=True),
                             before_id=whole_number(before), limit=101)
    more = len(rows) > 100
    return render_template("admin/audit.html", rows=rows[:100], args=args,
                           next_before=rows[99]["id"] if more else None,
                           actions=AUDIT_ACTIONS, first_page=not before)


bp.add_url_rule("/audit", endpoint="audit", view_func=audit_log, methods=["GET"])


@bp.get("/submitted/<int:message_id>/headers")
def submitted_headers(message_id: int) -> str:
    """The header block of a message submitted by SMTP (docs/smtp.md)."""
    with engine().connect() as conn:
        message = submissions.headers(conn, message_id)
    return render_template("admin/submitted_headers.html", message=message)


# --- users and tokens --------------------------------------------------------------------

def users_page() -> str:
    """Users and tokens; a token just created is shown once (handed over by
    :func:`create_token`'s redirect, sealed)."""
    new_token, token_owner = take_shown("new_token"), take_shown("token_owner")
    with engine().connect() as conn:
        people = users.list_users(conn)
        tokens = users.list_tokens(conn)
        sessions = {int(u["id"]): users.list_sessions(conn, int(u["id"])) for u in people}
        required = second_factor.required_roles(conn)
    if new_token:
        g.no_store = True  # the one page that shows a token must not be cached
    return render_template("admin/users.html", people=people, tokens=tokens, roles=ROLES,
                           sessions=sessions,
                           new_token=new_token, token_owner=token_owner,
                           scopes=access.SCOPES, role_scopes=access.ROLE_SCOPES,
                           second_factor_roles=required)


bp.add_url_rule("/users", endpoint="users", view_func=users_page, methods=["GET"])


def _act(action: str, fn: Callable[..., Any], *args: Any, keep_form: str | None = None,
         **kwargs: Any) -> Response:
    """Run a user/token change; show its result (or why it was refused) on the page, with
    the refused form (``keep_form``) filled in again."""
    try:
        with engine().begin() as conn:
            fn(conn, *args, **kwargs)
    except DomainError as exc:
        flash(localize(exc.message), "error")
        if keep_form:
            remember(keep_form)
    else:
        flash(action, "success")
    return redirect(url_for("admin.users"))


@bp.post("/users/create")
def create_user() -> Response:
    email = request.form.get("email", "").strip()
    return _act(_("Created %(email)s.", email=email), users.create_user, email,
                request.form.get("password", ""), request.form.get("role", ""),
                actor=actor(), keep_form="add_user")  # the password is never kept


@bp.post("/users/<int:user_id>/role")
def change_role(user_id: int) -> Response:
    if (asked := step_up()) is not None:
        return asked
    role = request.form.get("role", "")
    return _act(_("Role changed to %(role)s.", role=label(role)), users.update_role, user_id,
                role, actor=actor())


@bp.post("/users/<int:user_id>/active")
def set_active(user_id: int) -> Response:
    active = request.form.get("active") == "1"
    return _act(_("User enabled.") if active else
                _("User disabled: their sessions ended and their tokens stopped working."),
                users.set_active, user_id, active, actor=actor())


@bp.post("/users/<int:user_id>/password")
def reset_password(user_id: int) -> Response:
    """An admin sets a new password for someone who lost theirs; their sessions end."""
    return _act(_("Password reset: their sessions ended; tell them the new password "
                  "privately."), users.set_password, user_id, request.form.get("password", ""),
                actor=actor())


EXPIRY_CHOICES = {"30": 30, "90": 90, "365": 365, "never": None}


@bp.post("/tokens/create")
def create_token() -> str | Response:
    if (asked := step_up()) is not None:
        remember("create_token")  # the form comes back filled in after the check
        return asked
    user_id = request.form.get("user_id", "")
    try:
        with engine().begin() as conn:
            owner_id = whole_number(user_id)
            if owner_id is None:
                raise Invalid(N_("choose the user the token acts as"),
                              fields={"user_id": N_("required")})
            owner = users.get_user(conn, owner_id)
            expires = request.form.get("expires", "90")
            if expires not in EXPIRY_CHOICES:
                raise Invalid(N_("choose when the token expires"),
                              fields={"expires": N_("unknown")})
            token = users.create_token(conn, owner["id"], request.form.get("name", "").strip(),
                                       actor=actor(), expires_in_days=EXPIRY_CHOICES[expires],
                                       scopes=request.form.getlist("scopes"))
    except DomainError as exc:
        flash(localize(exc.message), "error")
        remember("create_token")
        return redirect(url_for("admin.users"))
    # POST/redirect/GET: a reload of the page that shows the token creates no second one.
    show_once("new_token", token)
    show_once("token_owner", owner["email"])
    return redirect(url_for("admin.users"), 303)


@bp.post("/users/<int:user_id>/second-factor/reset")
def reset_second_factor(user_id: int) -> Response:
    """Someone lost their authenticator and recovery codes: their second factor goes (and
    their sessions end); audited."""
    return _act(_("Second factor reset: their sessions ended; they set it up again at their "
                  "next login."), second_factor.reset, user_id, actor=actor())


@bp.post("/users/<int:user_id>/sessions/end")
def end_user_sessions(user_id: int) -> Response:
    """Sign a user out of every browser (their tokens keep working); audited."""
    return _act(_("Their sessions ended: every browser of theirs is signed out."),
                users.end_other_sessions, user_id, None, actor())


@bp.post("/users/second-factor-roles")
def second_factor_roles() -> Response:
    return _act(_("Saved which roles must use a second factor."),
                second_factor.set_required_roles, request.form.getlist("roles"),
                actor=actor())


@bp.post("/tokens/<int:token_id>/revoke")
def revoke_token(token_id: int) -> Response:
    return _act(_("Token revoked: requests with it now get 401."), users.revoke_token, token_id,
                actor=actor())


# --- a person's data on request (GDPR articles 15 and 17) --------------------------------

@bp.get("/personal-data")
def personal_data_page() -> str:
    return render_template("admin/personal_data.html", email="")


@bp.post("/personal-data/export")
def export_personal_data() -> Response | tuple[str, int]:
    """Everything about one address, downloaded as JSON (audited)."""
    email = request.form.get("email", "").strip()
    try:
        with engine().begin() as conn:
            data = personal_data.export(conn, email, actor=actor())
    except DomainError as exc:
        return render_template("admin/personal_data.html", email=email,
                               error=localize(exc.message)), 422
    response = answer(data)
    g.no_store = True
    response.headers["Content-Disposition"] = \
        f'attachment; filename="personal-data-{personal_data.address_hash(email)[:12]}.json"'
    return response


@bp.post("/personal-data/erase")
def erase_personal_data() -> Response | tuple[str, int]:
    email = request.form.get("email", "").strip()
    if request.form.get("confirm", "").strip().lower() != email.lower() or not email:
        return render_template("admin/personal_data.html", email=email, error=_(
            "Type the address again in the confirmation field to erase it: nothing was "
            "erased.")), 422
    try:
        with engine().begin() as conn:
            counts = personal_data.erase(conn, email, actor=actor())
    except DomainError as exc:
        return render_template("admin/personal_data.html", email=email,
                               error=localize(exc.message)), 422
    flash(_("Erased: %(subscribers)s subscriber, %(jobs)s jobs without the address, "
            "%(events)s feedback events; the address stays suppressed (as a hash).",
            subscribers=num(counts["subscribers"]), jobs=num(counts["jobs"]),
            events=num(counts["feedback_events"])), "success")
    return redirect(url_for("admin.personal_data_page"), 303)
