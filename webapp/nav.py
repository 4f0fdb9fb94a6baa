"""The main navigation: what each role can reach, from the same matrix that guards it."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app, request, url_for
from flask_babel import lazy_gettext as _l

from webapp import access
from webapp.context import role

ITEMS = [
    ("home.index", _l("Dashboard")),
    ("campaigns.index", _l("Campaigns")),
    ("lists.index", _l("Lists")),
    ("layouts.index", _l("Layouts")),
    ("sequences.index", _l("Sequences")),
    ("sequences.people", _l("Enrollments")),
    ("support.index", _l("Support")),
    ("transactional.index", _l("Transactional")),
    ("jobs.index", _l("Jobs")),
    ("inbox.index", _l("Failed jobs")),
    ("admin.suppressions", _l("Suppressions")),
    ("admin.bounces", _l("Bounce review")),
    ("domains.index", _l("Sending domains")),
    ("health.index", _l("Queue health")),
    ("event_webhooks.index", _l("Event webhooks")),
    ("admin.audit", _l("Audit log")),
    ("admin.users", _l("Users & tokens")),
    ("demo_mail.index", _l("Demo mail")),  # only in `senddock demo`
    ("admin.personal_data_page", _l("Personal data")),
]


@dataclass
class NavItem:
    url: str
    label: str
    active: bool


def nav_items() -> list[NavItem]:
    current = role()
    here = request.endpoint or ""
    # A page that is an item itself marks that item alone; any other page of an area (its
    # blueprint) marks the area's first item (Sequences, not also Enrollments).
    exact = here in {endpoint for endpoint, _ in ITEMS}
    first_of_area: dict[str, str] = {}
    for endpoint, _ in ITEMS:
        first_of_area.setdefault(endpoint.split(".")[0], endpoint)
    items = []
    for endpoint, label in ITEMS:
        if endpoint not in current_app.view_functions:
            continue
        allowed = access.allowed_roles(endpoint) or frozenset()
        if current in allowed:
            area = endpoint.split(".")[0]
            active = here == endpoint if exact else (
                here.split(".")[0] == area and area != "admin"
                and first_of_area[area] == endpoint)
            items.append(NavItem(url_for(endpoint), str(label), active))
    return items


def can_open(endpoint: str) -> bool:
    """Whether the current viewer may open ``endpoint``: templates link only to pages that
    answer, never to a 403 (the same matrix that guards the page decides)."""
    if endpoint not in current_app.view_functions:
        return False
    return role() in (access.allowed_roles(endpoint) or frozenset())


def init_app(app: Flask) -> None:
    app.jinja_env.globals["nav_items"] = nav_items
    app.jinja_env.globals["can_open"] = can_open
