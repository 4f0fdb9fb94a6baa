"""Who may call what: the role matrix, enforced in one place (P10).

Every endpoint must appear here. :func:`check` runs before every request; an endpoint the
matrix does not name is refused, so a new route cannot forget its check
(``tests/integration/test_access.py`` walks every registered route with every role).
"""

from __future__ import annotations

ALL_ROLES = frozenset({"admin", "marketer", "support"})
ADMIN = frozenset({"admin"})
MARKETING = frozenset({"admin", "marketer"})
SUPPORT = frozenset({"admin", "support"})

# Reachable without logging in (each does its own check: signed tokens, login form).
PUBLIC: frozenset[str] = frozenset({
    "static", "auth.login", "auth.logout", "public.unsubscribe", "public.unsubscribe_confirm",
    "public.unsubscribe_one_click", "ops.healthz", "api.openapi",
})

# Blueprint-wide rules: endpoint prefix -> roles. More specific entries in ENDPOINTS win.
BLUEPRINTS: dict[str, frozenset[str]] = {
    "home": ALL_ROLES,
    "campaigns": MARKETING,
    "lists": MARKETING,
    "support": SUPPORT,
    "admin": ADMIN,
    "inbox": frozenset({"admin", "support"}),
    "health": ALL_ROLES,
    "ops": ADMIN,
    "transactional": ADMIN,
}

ENDPOINTS: dict[str, frozenset[str]] = {
    # Inbox: support reads, only admins act.
    "inbox.retry": ADMIN, "inbox.retry_all": ADMIN, "inbox.dismiss": ADMIN,
    # API
    "api.list_lists": MARKETING, "api.create_list": MARKETING, "api.add_subscribers": MARKETING,
    "api.create_campaign": MARKETING, "api.get_campaign": MARKETING,
    "api.campaign_action": MARKETING,
    "api.get_job": ALL_ROLES,
    "api.create_verification": SUPPORT, "api.resend_verification": SUPPORT,
    "api.list_kinds": SUPPORT, "api.get_kind": SUPPORT, "api.put_kind": ADMIN,
    "api.create_message": SUPPORT, "api.cancel_messages": SUPPORT,
    "api.resend_message": SUPPORT,
    "api.list_suppressions": ADMIN, "api.add_suppression": ADMIN,
    "api.delete_suppression": ADMIN,
    "ops.metrics": ADMIN,
}


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
