"""Who may call what: the role matrix, enforced in one place (P10).

Every endpoint must appear here. :func:`check` runs before every request; an endpoint the
matrix does not name is refused, so a new route cannot forget its check
(``tests/integration/test_access.py`` walks every registered route with every role).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ALL_ROLES = frozenset({"admin", "marketer", "support"})
ADMIN = frozenset({"admin"})
MARKETING = frozenset({"admin", "marketer"})
SUPPORT = frozenset({"admin", "support"})

# Reachable without logging in (each does its own check: signed tokens, login form).
PUBLIC: frozenset[str] = frozenset({
    "static", "auth.login", "auth.logout", "public.unsubscribe", "public.unsubscribe_confirm",
    "public.unsubscribe_one_click", "ops.healthz", "api.openapi",
    # The preference page the unsubscribe link opens (the signed token is the proof).
    "public.preferences_save",
    # Subscription forms: anyone may subscribe (double opt-in, rate-limited per IP).
    "public.subscribe_form", "public.subscribe_css", "public.subscribe_submit",
    "public.subscribe_confirm", "public.subscribe_confirm_post", "api.subscribe",
    # Analytics and the archive: signed tracking URLs and the public web version.
    "tracking.click", "tracking.open_pixel", "tracking.web_version",
    "tracking.list_archive",
    # Provider webhooks authenticate themselves (signatures, basic auth, webhook tokens).
    "webhooks.ses", "webhooks.sendgrid", "webhooks.postmark", "webhooks.mailgun",
    "webhooks.generic",
})

# Blueprint-wide rules: endpoint prefix -> roles. More specific entries in ENDPOINTS win.
BLUEPRINTS: dict[str, frozenset[str]] = {
    "home": ALL_ROLES,
    "account": ALL_ROLES,
    "campaigns": MARKETING,
    "lists": MARKETING,
    "segments": MARKETING,
    "layouts": MARKETING,
    "support": SUPPORT,
    "admin": ADMIN,
    "inbox": frozenset({"admin", "support"}),
    "jobs": ADMIN,
    "domains": ADMIN,
    "health": ALL_ROLES,
    "ops": ADMIN,
    "transactional": ADMIN,
    "event_webhooks": ADMIN,
}

ENDPOINTS: dict[str, frozenset[str]] = {
    # Inbox: support reads, only admins act.
    "inbox.retry": ADMIN, "inbox.retry_all": ADMIN, "inbox.dismiss": ADMIN,
    "inbox.act_on_chosen": ADMIN,
    # API
    "api.list_lists": MARKETING, "api.create_list": MARKETING, "api.add_subscribers": MARKETING,
    "api.create_campaign": MARKETING, "api.get_campaign": MARKETING,
    "api.campaign_action": MARKETING, "api.campaign_stats": MARKETING,
    "api.list_segments": MARKETING, "api.create_segment": MARKETING,
    "api.get_segment": MARKETING, "api.update_segment": MARKETING,
    "api.delete_segment": MARKETING, "api.count_segment": MARKETING,
    "api.list_layouts": MARKETING, "api.create_layout": MARKETING,
    "api.get_layout": MARKETING, "api.update_layout": MARKETING,
    "api.delete_layout": MARKETING,
    # Marketers reach it, but the view shows them only campaign jobs, without payloads.
    "api.get_job": ALL_ROLES,
    "api.create_verification": SUPPORT, "api.resend_verification": SUPPORT,
    "api.list_kinds": SUPPORT, "api.get_kind": SUPPORT, "api.put_kind": ADMIN,
    "api.create_message": SUPPORT, "api.create_messages": SUPPORT,
    "api.cancel_messages": SUPPORT,
    "api.resend_message": SUPPORT,
    "api.list_suppressions": ADMIN, "api.add_suppression": ADMIN,
    "api.delete_suppression": ADMIN,
    "ops.metrics": ADMIN,
    "health.retry_relay": ADMIN,
}

# Who reads any job through GET /api/v1/jobs/{id}; other roles allowed there see less.
JOB_READERS = SUPPORT

# Endpoints whose view narrows what an allowed role sees (printed in docs/security.md).
NARROWED: dict[str, str] = {
    "api.get_job": "marketer: only jobs of a campaign, without payload (others answer 404)",
}


def _who(endpoint: str) -> str:
    roles = allowed_roles(endpoint) or frozenset()
    who = "anyone" if "anonymous" in roles else ", ".join(sorted(roles)) or "nobody"
    return f"{who}; {NARROWED[endpoint]}" if endpoint in NARROWED else who


def markdown_table(rules: Iterable[Any]) -> str:
    """The matrix as the Markdown table in docs/security.md, one row per route of
    ``rules`` (an app's ``url_map.iter_rules()``); tests/integration/test_access.py
    checks that the page shows exactly this table."""
    rows = ["| Route | Methods | Who |", "|---|---|---|"]
    for rule in sorted(rules, key=lambda r: (r.rule, r.endpoint)):
        methods = ", ".join(sorted(set(rule.methods or ()) - {"HEAD", "OPTIONS"}))
        path = rule.rule.replace("|", "\\|")
        rows.append(f"| `{path}` | {methods} | {_who(rule.endpoint)} |")
    return "\n".join(rows)


def allowed_roles(endpoint: str | None) -> frozenset[str] | None:
    """The roles allowed at ``endpoint``; ``ALL_ROLES | {'anonymous'}`` for public ones;
    None when the matrix does not know the endpoint (refused)."""
    if endpoint is None:
        return None
    if endpoint in PUBLIC:
        return ALL_ROLES | {"anonymous"}
    if endpoint in ENDPOINTS:
        return ENDPOINTS[endpoint]
    return BLUEPRINTS.get(endpoint.split(".", 1)[0]) if "." in endpoint and not \
        endpoint.startswith("api.") else None


DOCS_START = "<!-- role matrix: generated by `python -m webapp.access_docs`; do not edit -->"
DOCS_END = "<!-- end of role matrix -->"


def rewrite_docs(text: str, table: str) -> str:
    """``text`` (docs/security.md) with the block between the markers set to ``table``."""
    head, rest = text.split(DOCS_START, 1)
    _, tail = rest.split(DOCS_END, 1)
    return f"{head}{DOCS_START}\n{table}\n{DOCS_END}{tail}"

