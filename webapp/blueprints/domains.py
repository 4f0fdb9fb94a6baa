"""The *Sending domains* page (admins, docs/design.md §19): each domain mail goes out From, its DKIM
keys with the exact DNS record to publish, and the DNS checks in plain words."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.context import actor, config, engine
from webapp.domain import sending_domains
from webapp.domain.errors import Invalid
from webapp.form_memory import remember
from webapp.i18n import localize
from workers.building import dkim
from workers.core.i18n import message_of

bp = Blueprint("domains", __name__, url_prefix="/admin/domains")


@bp.get("")
def index() -> str:
    with engine().connect() as conn:
        domains = sending_domains.overview(conn, config())
    return render_template("domains/index.html", domains=domains,
                           algorithms=dkim.ALGORITHMS)


@bp.get("/<domain>")
def detail(domain: str) -> str | Response:
    """One domain: its keys and records, and the DNS checks (asked again with ?fresh=1)."""
    try:
        domain = dkim.normalize_domain(domain)
    except dkim.DkimError as exc:
        flash(localize(message_of(exc)), "error")
        return redirect(url_for("domains.index"))
    with engine().connect() as conn:
        keys = dkim.list_keys(conn, domain)
        report = sending_domains.report(conn, config(), domain,
                                        fresh=request.args.get("fresh") == "1")
    return render_template("domains/detail.html", domain=domain, keys=keys, report=report,
                           algorithms=dkim.ALGORITHMS)


@bp.post("/keys")
def create_key() -> Response:
    domain = request.form.get("domain", "")
    try:
        with engine().begin() as conn:
            key = sending_domains.create_key(
                conn, config(), domain, algorithm=request.form.get("algorithm", "rsa"),
                selector=request.form.get("selector", "").strip() or None, actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
        remember("add_key")
        return redirect(url_for("domains.index"))
    if key.status == "active":
        flash(_("Key %(selector)s created: %(domain)s's mail is signed with it from now "
                "on. Publish its DNS record below.", selector=key.selector, domain=key.domain),
              "success")
    else:
        flash(_("Key %(selector)s created as the next key: publish its record, wait for "
                "DNS, then activate it.", selector=key.selector), "success")
    return redirect(url_for("domains.detail", domain=key.domain))


@bp.post("/<domain>/keys/<selector>/activate")
def activate_key(domain: str, selector: str) -> Response:
    try:
        with engine().begin() as conn:
            key = sending_domains.activate_key(conn, domain, selector, actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
    else:
        flash(_("%(record)s signs %(domain)s's mail now. Keep the old key's record "
                "published for a few days.", record=key.record_name, domain=key.domain),
              "success")
    return redirect(url_for("domains.detail", domain=domain))


@bp.post("/<domain>/keys/<selector>/delete")
def delete_key(domain: str, selector: str) -> Response:
    try:
        with engine().begin() as conn:
            deleted = sending_domains.delete_key(conn, domain, selector, actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
    else:
        flash(_("Key %(selector)s deleted: remove its DNS record too.", selector=selector)
              if deleted else _("That key was already gone."), "success")
    return redirect(url_for("domains.detail", domain=domain))
from webapp.blueprints import domain_reports  # noqa: E402, F401  (routes on bp)
