"""Layouts (docs/design.md §20): reusable HTML around a campaign's body.

A layout is a sandboxed HTML template like a campaign's, with three placeholders:
``{{ content }}`` (where the campaign's HTML goes, exactly once), ``{{ unsubscribe_url }}``
(required: every campaign sent in a layout carries its recipient's unsubscribe link) and
``{{ postal_address }}`` (the layout's postal address, shown as text). The message is built
by ``workers.building.message.apply_layout``, for the preview and the send alike.

Guarantees kept here:

- a layout without the content or the unsubscribe placeholder, or that does not compile, is
  refused with the field and a sentence saying what is missing (P9);
- a layout used by a campaign that is scheduled, sending or paused cannot change (its
  messages would differ mid-send), nor can any layout a campaign uses be deleted;
  changing one bumps its drafts' version, so the workers' compiled copy follows.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Conflict, Invalid, NotFound
from workers.building.html_text import html_to_text
from workers.building.message import (
    CONTENT_PLACEHOLDER,
    MAX_TEMPLATE_CHARS,
    UNSUBSCRIBE_PLACEHOLDER,
    Layout,
    TemplateError,
    apply_layout,
    compile_campaign,
)
from workers.core.i18n import N_
from workers.core.states import Campaign, sql_list

MAX_NAME = 200
MAX_ADDRESS = 500
FIELDS = ("id", "name", "html", "postal_address", "created_at", "updated_at")
STARTER = """<!doctype html>
<html><body style="margin:0;background:#f4f4f4;font-family:Arial,sans-serif">
<div style="max-width:600px;margin:0 auto;background:#fff;padding:24px">
  {{ content }}
</div>
<p style="max-width:600px;margin:12px auto;color:#777;font-size:12px;text-align:center">
  {{ postal_address }}<br>
  <a href="{{ unsubscribe_url }}">Unsubscribe</a>
</p>
</body></html>
"""


def check(name: Any, html: Any, postal_address: Any) -> dict[str, str]:
    """The layout's fields, trimmed, or :class:`Invalid` naming every bad one."""
    fields: dict[str, Any] = {}
    raw_name = name if isinstance(name, str) else ""
    name = raw_name.strip()
    html = html if isinstance(html, str) else ""
    if postal_address is not None and not isinstance(postal_address, str):
        fields["postal_address"] = N_("must be a string")
    raw_address = postal_address if isinstance(postal_address, str) else ""
    address = raw_address.strip()
    if not name:
        fields["name"] = N_("required")
    elif len(raw_name) > MAX_NAME:  # as sent: the API's maxLength
        fields["name"] = N_("at most %(max)s characters", max=MAX_NAME)
    if len(raw_address) > MAX_ADDRESS:
        fields["postal_address"] = N_("at most %(max)s characters", max=MAX_ADDRESS)
    if not html.strip():
        fields["html"] = N_("required")
    elif len(html) > MAX_TEMPLATE_CHARS:
        fields["html"] = N_("at most %(max)s characters", max=MAX_TEMPLATE_CHARS)
    elif len(CONTENT_PLACEHOLDER.findall(html)) != 1:
        fields["html"] = N_("put {{ content }} exactly once, where the campaign's body goes")
    elif not UNSUBSCRIBE_PLACEHOLDER.search(html):
        fields["html"] = N_("put {{ unsubscribe_url }} in it (the footer's unsubscribe "
                            "link): every campaign sent in it must carry one")
    else:
        try:
            compile_campaign("x", None, "", Layout(html, address))
            compile_campaign("x", None, apply_layout(Layout(html, address), ""))
        except TemplateError as exc:
            fields["html"] = N_("line %(line)s: %(message)s", line=exc.line,
                                message=exc.message) if exc.line else exc.message
    if fields:
        raise Invalid(N_("check %(fields)s", fields=", ".join(fields)),
                      fields=fields)
    return {"name": name, "html": html, "postal_address": address}


def get(conn: Connection, layout_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text(f"SELECT {', '.join(FIELDS)} FROM layouts WHERE id = :id"),
                       {"id": layout_id}).mappings().first()
    if row is None:
        raise NotFound(N_("layout %(id)s does not exist", id=str(layout_id)))
    return dict(row)


def all_layouts(conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sa.text(
        f"SELECT {', '.join(FIELDS)}, (SELECT count(*) FROM campaigns c "
        "WHERE c.layout_id = layouts.id) AS campaigns FROM layouts ORDER BY lower(name)"
    )).mappings()]


def _taken(conn: Connection, name: str, layout_id: int | None) -> None:
    if conn.execute(sa.text("SELECT 1 FROM layouts WHERE lower(name) = lower(:n) "
                            "AND id IS DISTINCT FROM :id"),
                    {"n": name, "id": layout_id}).first() is not None:
        raise Conflict(N_("a layout named “%(name)s” exists already", name=name),
                       fields={"name": N_("already used")})


def create(conn: Connection, data: dict[str, Any], *, actor: str = "system"
           ) -> dict[str, Any]:
    values = check(data.get("name"), data.get("html"), data.get("postal_address"))
    _taken(conn, values["name"], None)
    layout_id = conn.execute(sa.text(
        "INSERT INTO layouts (name, html, postal_address) VALUES (:name, :html, "
        ":postal_address) RETURNING id"), values).scalar_one()
    audit.record(conn, actor, "layout.create", f"layout:{layout_id}", name=values["name"])
    return get(conn, int(layout_id))


def _in_flight(conn: Connection, layout_id: int) -> str | None:
    row = conn.execute(sa.text(
        "SELECT name FROM campaigns WHERE layout_id = :id AND status IN "
        f"{sql_list((Campaign.SCHEDULED, *Campaign.STARTED))} ORDER BY id LIMIT 1"),
        {"id": layout_id}).first()
    return None if row is None else str(row.name)


def update(conn: Connection, layout_id: int, data: dict[str, Any], *,
           actor: str = "system") -> dict[str, Any]:
    conn.execute(sa.text("SELECT 1 FROM layouts WHERE id = :id FOR UPDATE"), {"id": layout_id})
    get(conn, layout_id)
    values = check(data.get("name"), data.get("html"), data.get("postal_address"))
    _taken(conn, values["name"], layout_id)
    busy = _in_flight(conn, layout_id)
    if busy is not None:
        raise Conflict(N_("the campaign “%(name)s” is being sent in this layout, so it cannot "
                          "change now; save it as a new layout instead", name=busy))
    conn.execute(sa.text("UPDATE layouts SET name = :name, html = :html, postal_address = "
                         ":postal_address, updated_at = now() WHERE id = :id"),
                 {**values, "id": layout_id})
    conn.execute(sa.text("UPDATE campaigns SET updated_at = now() WHERE layout_id = :id "
                         f"AND status = '{Campaign.DRAFT}'"), {"id": layout_id})
    audit.record(conn, actor, "layout.update", f"layout:{layout_id}")
    return get(conn, layout_id)


def delete(conn: Connection, layout_id: int, *, actor: str = "system") -> None:
    get(conn, layout_id)
    user = conn.execute(sa.text("SELECT name FROM campaigns WHERE layout_id = :id "
                                "ORDER BY id LIMIT 1"), {"id": layout_id}).first()
    if user is not None:
        raise Conflict(N_("the campaign “%(name)s” uses this layout, so it cannot be "
                          "deleted", name=user.name))
    conn.execute(sa.text("DELETE FROM layouts WHERE id = :id"), {"id": layout_id})
    audit.record(conn, actor, "layout.delete", f"layout:{layout_id}")


def check_for_campaign(conn: Connection, layout_id: Any) -> Layout | None:
    """The layout a campaign may pick (None: none); NotFound when there is no such one."""
    if isinstance(layout_id, float) and layout_id.is_integer():
        layout_id = int(layout_id)  # JSON Schema's integer takes 240.0
    if layout_id is None or (layout_id in ("", 0) and not isinstance(layout_id, bool)):
        return None
    if not isinstance(layout_id, int) or isinstance(layout_id, bool):
        raise Invalid(N_("layout_id must be a number"),
                      fields={"layout_id": N_("a layout id or null")})
    row = conn.execute(sa.text("SELECT html, postal_address FROM layouts WHERE id = :id"),
                       {"id": layout_id}).first()
    if row is None:
        raise NotFound(N_("layout %(id)s does not exist", id=str(layout_id)),
                       fields={"layout_id": N_("no such layout")})
    return Layout(row.html, row.postal_address)


def text_from_html(layout: Layout | None, html: str) -> str:
    """The plain-text part the workers would generate from ``html`` (in ``layout``), for
    the marketer to edit: placeholders stay placeholders, so it is still a template."""
    return html_to_text(apply_layout(layout, html) if layout is not None else html,
                        template_links=True)
