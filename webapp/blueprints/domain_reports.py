"""Receiver reports on the *Sending domains* pages (admins; docs/deliverability.md): the
upload page with the latest reports and refused files, and each domain's deliverability
page. Registered on the domains blueprint, so webapp/access.py's rule for domain pages
applies."""

from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.blueprints.domains import bp
from webapp.context import actor, config, engine
from webapp.domain import deliverability, warmups
from webapp.i18n import localize
from workers.after_acceptance.receiver_reports.store import ingest
from workers.building import dkim
from workers.core.i18n import message_of
from workers.delivery import warmup

MAX_FILES = 50


@bp.get("/reports")
def reports() -> str:
    with engine().connect() as conn:
        latest = deliverability.recent(conn)
    return render_template("domains/reports.html", **latest)


@bp.post("/reports")
def upload_reports() -> Response:
    files = [f for f in request.files.getlist("files") if f and f.filename]
    if not files:
        flash(_("Choose one or more report files to upload."), "error")
        return redirect(url_for("domains.reports"))
    if len(files) > MAX_FILES:
        flash(_("At most %(n)s files at once.", n=MAX_FILES), "error")
        return redirect(url_for("domains.reports"))
    stored = duplicates = 0
    for upload in files:
        data = upload.read()
        with engine().begin() as conn:
            result = ingest(conn, data, filename=upload.filename or "", source="upload")
        if result.error is not None:
            flash(_("%(file)s was not read: %(reason)s", file=upload.filename,
                    reason=localize(result.error)), "error")
            continue
        for report in result.reports:
            if report.duplicate:
                duplicates += 1
            else:
                stored += 1
    if stored or duplicates:
        flash(_("%(stored)s report(s) stored, %(dup)s already stored before.",
                stored=stored, dup=duplicates), "success")
    return redirect(url_for("domains.reports"))


def _domain(domain: str) -> str | None:
    """The domain in the address, normalized; None (with the reason flashed) if it is none."""
    try:
        return dkim.normalize_domain(domain)
    except dkim.DkimError as exc:
        flash(localize(message_of(exc)), "error")
        return None


@bp.get("/<domain>/deliverability")
def deliverability_page(domain: str) -> str | Response:
    name = _domain(domain)
    if name is None:
        return redirect(url_for("domains.index"))
    domain = name
    span = deliverability.span(request.args.get("days", ""), deliverability.PAGE_DAYS)
    with engine().connect() as conn:
        view = deliverability.domain_view(conn, config(), domain, span)
        warm = warmup.status(conn, domain)
    return render_template("domains/deliverability.html", v=view, warm=warm,
                           ramp=warmup.RAMP)


@bp.post("/<domain>/warmup")
def start_warmup(domain: str) -> Response:
    """Start (or restart from day 1) the domain's warm-up (docs/design.md §33)."""
    name = _domain(domain)
    if name is None:
        return redirect(url_for("domains.index"))
    domain = name
    back = redirect(url_for("domains.deliverability_page", domain=domain) + "#warmup")
    try:
        caps = warmup.parse_caps(request.form.get("caps", ""))
        share = warmup.parse_hour_share(request.form.get("hour_share", ""))
    except warmup.WarmupError as exc:
        flash(localize(message_of(exc)), "error")
        return back
    with engine().begin() as conn:
        warmups.start(conn, domain, caps, share, actor())
    flash(_("Warm-up of %(domain)s started: day 1 today.", domain=domain), "success")
    return back


@bp.post("/<domain>/warmup/stop")
def stop_warmup(domain: str) -> Response:
    name = _domain(domain)
    if name is None:
        return redirect(url_for("domains.index"))
    domain = name
    with engine().begin() as conn:
        stopped = warmups.stop(conn, domain, actor())
    if stopped:
        flash(_("Warm-up of %(domain)s stopped: its mail is no longer capped.",
                domain=domain), "success")
    return redirect(url_for("domains.deliverability_page", domain=domain) + "#warmup")


@bp.get("/providers")
def providers_page() -> str:
    from webapp.domain import providers

    span = deliverability.span(request.args.get("days", ""), 30)
    with engine().connect() as conn:
        view = providers.provider_view(conn, config(), span)
    return render_template("domains/providers.html", v=view)
