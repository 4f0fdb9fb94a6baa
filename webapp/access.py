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
    "auth.second_factor",  # the login's second step (checks its pending login itself)
    "auth.sso_start", "auth.sso_callback",  # single sign-on (state, PKCE, ID token checks)
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
    "webhooks.receive",
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
    "sequences": MARKETING,
    "demo_mail": ADMIN,  # registered only by `senddock demo`
}

ENDPOINTS: dict[str, frozenset[str]] = {
    # Inbox: support reads, only admins act.
    "inbox.retry": ADMIN, "inbox.retry_all": ADMIN, "inbox.dismiss": ADMIN,
    "inbox.act_on_chosen": ADMIN,
    # Sequences: a person's enrollments are support's to read too.
    "sequences.people": ALL_ROLES,
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
    "api.upload_report": ADMIN, "api.list_reports": ADMIN,
    "api.domain_deliverability": ADMIN, "api.provider_figures": ADMIN,
    "api.list_warmups": ADMIN, "api.get_warmup": ADMIN, "api.put_warmup": ADMIN,
    "api.delete_warmup": ADMIN,
    "api.list_bounce_rules": ADMIN, "api.add_bounce_rule": ADMIN,
    "api.delete_bounce_rule": ADMIN,
    "ops.metrics": ADMIN,
    "health.retry_relay": ADMIN,
    # Sequences: marketers build, support reads a person's enrollments, the
    # team's app posts events with the token it sends messages with.
    "api.list_sequences": MARKETING, "api.create_sequence": MARKETING,
    "api.get_sequence": MARKETING, "api.update_sequence": MARKETING,
    "api.sequence_action": MARKETING, "api.sequence_funnel": MARKETING,
    "api.add_sequence_step": MARKETING, "api.update_sequence_step": MARKETING,
    "api.remove_sequence_step": MARKETING, "api.reorder_sequence_steps": MARKETING,
    "api.person_enrollments": ALL_ROLES, "api.post_event": SUPPORT,
    "api.export_personal_data": ADMIN, "api.erase_personal_data": ADMIN,
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



# --- API token scopes ----------------------------------------------------------------------
# A token carries scopes; an API call needs the endpoint's role (above) AND the endpoint's
# scope (below) among the token's. ``admin`` covers every endpoint, the others only theirs;
# an API endpoint missing here needs ``admin`` (deny by default for narrower tokens).
# tests/integration/test_token_scopes.py walks every API route with each scope.
SEND, READ_JOBS, CAMPAIGNS, ADMIN_SCOPE = "send", "read_jobs", "campaigns", "admin"
SCOPES: tuple[str, ...] = (SEND, READ_JOBS, CAMPAIGNS, ADMIN_SCOPE)
SCOPE_LABELS: dict[str, str] = {
    SEND: "send transactional mail", READ_JOBS: "read jobs",
    CAMPAIGNS: "manage lists and campaigns", ADMIN_SCOPE: "admin (everything the role may)",
}
# The scopes a role may give its tokens (a token is never wider than its owner's role).
ROLE_SCOPES: dict[str, frozenset[str]] = {
    "admin": frozenset(SCOPES),
    "marketer": frozenset({CAMPAIGNS, READ_JOBS}),
    "support": frozenset({SEND, READ_JOBS}),
}

ENDPOINT_SCOPES: dict[str, str] = {
    "api.create_message": SEND, "api.create_messages": SEND, "api.cancel_messages": SEND,
    "api.resend_message": SEND, "api.create_verification": SEND,
    "api.resend_verification": SEND, "api.list_kinds": SEND, "api.get_kind": SEND,
    "api.get_job": READ_JOBS,
    "api.list_lists": CAMPAIGNS, "api.create_list": CAMPAIGNS,
    "api.add_subscribers": CAMPAIGNS, "api.create_campaign": CAMPAIGNS,
    "api.get_campaign": CAMPAIGNS, "api.campaign_action": CAMPAIGNS,
    "api.campaign_stats": CAMPAIGNS, "api.list_segments": CAMPAIGNS,
    "api.create_segment": CAMPAIGNS, "api.get_segment": CAMPAIGNS,
    "api.update_segment": CAMPAIGNS, "api.delete_segment": CAMPAIGNS,
    "api.count_segment": CAMPAIGNS, "api.list_layouts": CAMPAIGNS,
    "api.create_layout": CAMPAIGNS, "api.get_layout": CAMPAIGNS,
    "api.update_layout": CAMPAIGNS, "api.delete_layout": CAMPAIGNS,
    "api.put_kind": ADMIN_SCOPE, "api.list_suppressions": ADMIN_SCOPE,
    "api.add_suppression": ADMIN_SCOPE, "api.delete_suppression": ADMIN_SCOPE,
    "ops.metrics": ADMIN_SCOPE,
    "api.export_personal_data": ADMIN_SCOPE, "api.erase_personal_data": ADMIN_SCOPE,
    "api.list_sequences": CAMPAIGNS, "api.create_sequence": CAMPAIGNS,
    "api.get_sequence": CAMPAIGNS, "api.update_sequence": CAMPAIGNS,
    "api.sequence_action": CAMPAIGNS, "api.sequence_funnel": CAMPAIGNS,
    "api.add_sequence_step": CAMPAIGNS, "api.update_sequence_step": CAMPAIGNS,
    "api.remove_sequence_step": CAMPAIGNS, "api.reorder_sequence_steps": CAMPAIGNS,
    "api.person_enrollments": READ_JOBS, "api.post_event": SEND,
    "api.upload_report": ADMIN_SCOPE, "api.list_reports": ADMIN_SCOPE,
    "api.domain_deliverability": ADMIN_SCOPE, "api.provider_figures": ADMIN_SCOPE,
    "api.list_warmups": ADMIN_SCOPE, "api.get_warmup": ADMIN_SCOPE,
    "api.put_warmup": ADMIN_SCOPE, "api.delete_warmup": ADMIN_SCOPE,
    "api.list_bounce_rules": ADMIN_SCOPE, "api.add_bounce_rule": ADMIN_SCOPE,
    "api.delete_bounce_rule": ADMIN_SCOPE,
}


def endpoint_scope(endpoint: str | None) -> str:
    """The scope a token needs at ``endpoint`` (``admin`` when the table does not say)."""
    return ENDPOINT_SCOPES.get(endpoint or "", ADMIN_SCOPE)


def token_allows(scopes: Iterable[str], endpoint: str | None) -> bool:
    """Whether a token with ``scopes`` may call ``endpoint`` (its role is checked apart)."""
    held = frozenset(scopes)
    return ADMIN_SCOPE in held or endpoint_scope(endpoint) in held


def scopes_for_role(role: str) -> frozenset[str]:
    return ROLE_SCOPES.get(role, frozenset())


def scopes_table() -> str:
    """The scopes as the Markdown table in docs/security.md (who may hold each, what it
    opens)."""
    rows = ["| Scope | Meaning | Roles that may hold it | Endpoints |", "|---|---|---|---|"]
    for scope in SCOPES:
        roles = ", ".join(sorted(r for r, s in ROLE_SCOPES.items() if scope in s))
        ends = ("every endpoint the owner's role allows" if scope == ADMIN_SCOPE else
                ", ".join(f"`{e}`" for e in sorted(ENDPOINT_SCOPES)
                          if ENDPOINT_SCOPES[e] == scope))
        rows.append(f"| `{scope}` | {SCOPE_LABELS[scope]} | {roles} | {ends} |")
    return "\n".join(rows)


SCOPES_DOCS_START = ("<!-- token scopes: generated by `python -m webapp.access_docs`; "
                     "do not edit -->")
SCOPES_DOCS_END = "<!-- end of token scopes -->"


def rewrite_scopes_docs(text: str, table: str) -> str:
    """``text`` with the scopes block set to ``table`` (appended when the markers are
    missing)."""
    if SCOPES_DOCS_START not in text:
        return f"{text.rstrip()}\n\n{SCOPES_DOCS_START}\n{table}\n{SCOPES_DOCS_END}\n"
    head, rest = text.split(SCOPES_DOCS_START, 1)
    _, tail = rest.split(SCOPES_DOCS_END, 1)
    return f"{head}{SCOPES_DOCS_START}\n{table}\n{SCOPES_DOCS_END}{tail}"
