"""Lists and subscribers in the browser: lists, the subscriber table (keyset paging and
search that stay fast at a million), one subscriber at a time, CSV import and export."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, session, url_for
from flask_babel import gettext as _
from flask_login import current_user
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Response

from webapp import errors
from webapp.auth import step_up
from webapp.context import actor, config, engine
from webapp.domain import import_uploads, imports, lists, subscriptions
from webapp.domain.errors import DomainError, Invalid
from webapp.domain.fields import whole_number
from webapp.form_memory import remember
from webapp.i18n import localize

bp = Blueprint("lists", __name__, url_prefix="/lists")


def _detail(list_id: int) -> str:
    return url_for("lists.detail", list_id=list_id)


@bp.get("/")
def index() -> str:
    with engine().connect() as conn:
        return render_template("lists/index.html", lists=lists.all_lists(conn))


@bp.post("/")
def create() -> Response | tuple[str, int]:
    try:
        with engine().begin() as conn:
            created = lists.create_list(conn, request.form.get("name", ""),
                                        request.form.get("description", ""), actor=actor())
    except Invalid as exc:
        with engine().connect() as conn:
            return render_template("lists/index.html", lists=lists.all_lists(conn),
                                   error=localize(exc.message), values=request.form), 422
    flash(_("List “%(name)s” created. Now add subscribers: import a CSV file or add them "
            "one by one.", name=created["name"]), "success")
    return redirect(_detail(created["id"]), 303)


def _cursor(name: str) -> int | None:
    return whole_number(request.args.get(name))


@bp.get("/<int:list_id>")
def detail(list_id: int) -> str:
    query = request.args.get("q", "").strip()[:200]
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
        page = lists.subscriber_page(conn, list_id, after=_cursor("after"),
                                     before=_cursor("before"), query=query)
        form = subscriptions.get_form(conn, list_id)
    template = "partials/_list_subscribers.html" if request.args.get("fragment") == \
        "subscribers" else "lists/detail.html"
    base_url = config().base_url
    form_url = base_url + url_for("public.subscribe_form", list_id=list_id)
    return render_template(
        template, the_list=the_list, page=page, q=query, form=form, form_url=form_url,
        form_url_es=base_url + url_for("public.subscribe_form", list_id=list_id, lang="es"),
        embed_snippet=subscriptions.embed_snippet(form_url, form["title"] or the_list["name"]),
        api_call=f"POST {base_url}{url_for('api.subscribe', list_id=list_id)}")


@bp.post("/<int:list_id>/form")
def save_form(list_id: int) -> Response:
    form = request.form
    try:
        with engine().begin() as conn:
            subscriptions.save_form(conn, list_id, enabled=form.get("enabled") == "on",
                                    title=form.get("title", ""), intro=form.get("intro", ""),
                                    accent=form.get("accent", ""), actor=actor())
    except DomainError as exc:
        flash(_("Form not saved: %(why)s", why=localize(exc.message)), "error")
    else:
        flash(_("Subscription form saved."), "success")
    return redirect(_detail(list_id) + "#subscription-form", 303)


@bp.post("/<int:list_id>/rename")
def rename(list_id: int) -> Response:
    try:
        with engine().begin() as conn:
            lists.rename_list(conn, list_id, request.form.get("name", ""),
                              request.form.get("description", ""), actor=actor())
    except DomainError as exc:
        flash(_("Not renamed: %(why)s", why=localize(exc.message)), "error")
    else:
        flash(_("List renamed."), "success")
    return redirect(_detail(list_id), 303)


@bp.post("/<int:list_id>/delete")
def delete(list_id: int) -> Response:
    try:
        with engine().begin() as conn:
            lists.delete_list(conn, list_id, actor=actor())
    except DomainError as exc:
        flash(_("Not deleted: %(why)s", why=localize(exc.message)), "error")
        return redirect(_detail(list_id), 303)
    flash(_("List deleted. Its subscribers stay on their other lists."), "success")
    return redirect(url_for("lists.index"), 303)


@bp.post("/<int:list_id>/subscribers")
def add_subscriber(list_id: int) -> Response:
    form = request.form
    try:
        with engine().begin() as conn:
            member = lists.add_member(conn, list_id, form.get("email", ""),
                                      form.get("name", ""),
                                      lists.parse_attributes(form.get("attributes", "")),
                                      actor=actor())
    except DomainError as exc:
        flash(_("Not added: %(why)s", why=localize(exc.message)), "error")
        remember("add_subscriber")
    else:
        flash(_("%(email)s is on the list.", email=member["email"]), "success")
    return redirect(_detail(list_id), 303)


@bp.route("/<int:list_id>/subscribers/<int:subscriber_id>", methods=["GET", "POST"])
def subscriber(list_id: int, subscriber_id: int) -> Response | tuple[str, int]:
    error = None
    values = None
    if request.method == "POST":
        values = request.form
        try:
            with engine().begin() as conn:
                lists.update_member(conn, list_id, subscriber_id,
                                    email=values.get("email", ""),
                                    name=values.get("name", ""),
                                    attributes=lists.parse_attributes(
                                        values.get("attributes", "")),
                                    status=values.get("status", ""), actor=actor())
        except DomainError as exc:
            error = exc
        else:
            flash(_("Subscriber saved."), "success")
            return redirect(_detail(list_id), 303)
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
        member = lists.get_member(conn, list_id, subscriber_id)
    return render_template("lists/subscriber.html", the_list=the_list, member=member,
                           values=values, error=error,
                           statuses=lists.SUBSCRIBER_STATUSES), 422 if error else 200


@bp.post("/<int:list_id>/subscribers/<int:subscriber_id>/remove")
def remove_subscriber(list_id: int, subscriber_id: int) -> Response:
    with engine().begin() as conn:
        lists.remove_member(conn, list_id, subscriber_id, actor=actor())
    flash(_("Subscriber removed from the list."), "success")
    return redirect(_detail(list_id), 303)


@bp.route("/<int:list_id>/import", methods=["GET", "POST"])
def import_csv(list_id: int) -> str | tuple[str, int]:
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
    if request.method != "POST":
        return render_template("lists/import.html", the_list=the_list)
    # The form parser spools the upload to a temporary file (size limit: security.py);
    # the import reads it line by line.
    upload = request.files.get("file")
    if upload is None or not upload.filename:
        return render_template("lists/import.html", the_list=the_list,
                               error=_("Choose a CSV file to import.")), 422
    if request.form.get("action") == "check":
        _forget_upload(list_id)  # the file checked before is replaced: its space first
        with engine().begin() as conn:
            kept = import_uploads.keep(conn, _owner(), list_id, upload.filename,
                                       upload.stream)
        session["import_upload"] = {"token": kept.token, "list_id": list_id}
        return _run_import(the_list, kept, None, dry_run=True)
    try:
        with engine().begin() as conn:
            report = imports.import_csv(conn, list_id, upload.stream, actor=actor())
            the_list = lists.get_list(conn, list_id)
    except Invalid as exc:
        return render_template("lists/import.html", the_list=the_list,
                               error=localize(exc.message), filename=upload.filename), 422
    return render_template("lists/import_report.html", the_list=the_list, report=report,
                           filename=upload.filename, max_reported=imports.MAX_REPORTED)


def _binary_size(count: int) -> str:
    """A byte count as the settings' help writes it: 512 MiB, 64 KiB, 900 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            amount = count / size
            return f"{amount:.0f} {unit}" if amount == int(amount) else f"{amount:.1f} {unit}"
    return f"{count} bytes"


CSV_EXAMPLE = "\n".join(("email,name,plan", "ada@example.com,Ada Lovelace,pro",
                         "grace@example.com,Grace Hopper,team"))


@bp.context_processor
def import_limit() -> dict[str, str]:
    """The upload limit the import form states (docs/design.md §35), and its example file
    (data, the same in every language)."""
    return {"import_limit": _binary_size(config().max_import_bytes),
            "csv_example": CSV_EXAMPLE}


@bp.errorhandler(RequestEntityTooLarge)
def import_too_large(exc: RequestEntityTooLarge) -> tuple[str, int] | Response:
    """A file over SENDDOCK_MAX_IMPORT_BYTES is refused before any of it is read into the
    database, checked first or not (docs/design.md §35): the upload form again, saying the
    limit. Flask spools what it read of the body to a temporary file it deletes."""
    list_id = (request.view_args or {}).get("list_id")
    if request.endpoint != "lists.import_csv" or not isinstance(list_id, int):
        return errors.http_error(exc)  # any other form of the area: the usual 413
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
    limit = _binary_size(config().max_import_bytes)
    return render_template("lists/import.html", the_list=the_list, error=_(
        "The file is larger than the import's limit of %(limit)s "
        "(SENDDOCK_MAX_IMPORT_BYTES): nothing was imported or kept. Split the file, or ask "
        "an administrator to raise the limit.", limit=limit)), 413


def _owner() -> int:
    return int(current_user.id)


def _forget_upload(list_id: int) -> None:
    """Delete the file the user keeps for the list, if any, and reclaim its space; the
    session no longer names it."""
    session.pop("import_upload", None)
    with engine().begin() as conn:
        forgotten = import_uploads.forget(conn, _owner(), list_id)
    if forgotten:
        import_uploads.reclaim(engine())


def _run_import(the_list: dict[str, Any], kept: import_uploads.KeptUpload,
                roles: list[str] | None, *, dry_run: bool) -> str | tuple[str, int]:
    """Import the kept file with ``roles``, or check it (``dry_run``: read-only look-ups,
    nothing written). A real import deletes the kept file in its transaction: imported once
    only. A file that cannot be read is deleted too (a mapping that does not fit keeps it)."""
    list_id = the_list["id"]
    try:
        with engine().connect() as conn:
            with conn.begin() as transaction:
                report = imports.import_csv(conn, list_id,
                                            import_uploads.lines(conn, kept.token),
                                            actor=actor(), roles=roles, dry_run=dry_run)
                if dry_run:
                    transaction.rollback()  # drops the temporary table; nothing else to undo
                else:
                    import_uploads.drop(conn, kept.token)
            the_list = lists.get_list(conn, list_id)
    except Invalid as exc:
        if "mapping" not in exc.fields:  # the file itself cannot be read: not kept
            _forget_upload(list_id)
        return render_template("lists/import.html", the_list=the_list,
                               error=localize(exc.message), filename=kept.filename), 422
    if dry_run:
        return render_template("lists/import_check.html", the_list=the_list, report=report,
                               filename=kept.filename, token=kept.token, roles=imports.ROLES,
                               max_reported=imports.MAX_REPORTED)
    import_uploads.reclaim(engine())  # the imported file's chunks were deleted
    session.pop("import_upload", None)
    return render_template("lists/import_report.html", the_list=the_list, report=report,
                           filename=kept.filename, max_reported=imports.MAX_REPORTED)


@bp.post("/<int:list_id>/import/<token>")
def import_checked(list_id: int, token: str) -> str | tuple[str, int] | Response:
    """The checked file, with the columns as mapped: checked again, or imported. Any web
    process can answer: the file waits in the database (an hour at most)."""
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
    mine = session.get("import_upload") or {}
    if request.form.get("action") == "discard":  # "Choose another file": start over
        _forget_upload(list_id)
        return redirect(url_for("lists.import_csv", list_id=list_id), 303)
    with engine().begin() as conn:
        kept = import_uploads.kept(conn, token, _owner(), list_id) \
            if mine.get("token") == token and mine.get("list_id") == list_id else None
    if kept is None:
        flash(_("The checked file is no longer kept (a file checked first waits %(minutes)s "
                "minutes, and only for who uploaded it): nothing was imported. Upload it "
                "again.", minutes=import_uploads.KEEP_SECONDS // 60), "error")
        return redirect(url_for("lists.import_csv", list_id=list_id), 303)
    # One role per column of the file's header, no more: a form's "columns" is checked
    # against the file, never used as a count on its own.
    try:
        with engine().connect() as conn:
            header_size = imports.header_size(import_uploads.lines(conn, kept.token))
    except Invalid as exc:
        _forget_upload(list_id)
        return render_template("lists/import.html", the_list=the_list, filename=kept.filename,
                               error=localize(exc.message)), 422
    if whole_number(request.form.get("columns")) != header_size:
        return render_template("lists/import.html", the_list=the_list, filename=kept.filename,
                               error=_("The column mapping does not fit the file's header "
                                       "(%(count)s columns). Check the file again.",
                                       count=header_size)), 422
    roles = [request.form.get(f"role_{i}", "skip") for i in range(header_size)]
    return _run_import(the_list, kept, roles, dry_run=request.form.get("action") != "import")


@bp.get("/<int:list_id>/export.csv")
def export(list_id: int) -> Response:
    if (asked := step_up()) is not None:
        return asked  # a second-factor check first when the last one is old
    eng = engine()
    with eng.connect() as conn:
        the_list = lists.get_list(conn, list_id)

    def stream() -> Iterator[str]:
        with eng.connect() as conn:
            yield from lists.export_csv(conn, list_id)

    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in the_list["name"])[:60]
    response = Response(stream(), mimetype="text/csv")
    response.headers["Content-Disposition"] = f'attachment; filename="{safe or "list"}.csv"'
    return response
