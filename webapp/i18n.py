"""The UI in English and Spanish (docs/design.md §25): Flask-Babel, the language chosen from the
user's setting or the browser's ``Accept-Language``, and numbers and dates formatted for it.

Catalogs live in ``translations/<lang>/LC_MESSAGES/messages.po`` with their compiled
``messages.mo`` committed beside them (so a fresh clone and a built wheel need no build
step); ``tests/unit/test_translations.py`` checks that no template text is left
unwrapped, that every message has its Spanish translation and that the ``.mo`` files match
the ``.po`` files. To update: ``pybabel extract --sort-output -F babel.cfg -k _l -k N_
-k lazy_pgettext:1c,2 -o /tmp/messages.pot .``, ``pybabel update -N --ignore-obsolete -i
/tmp/messages.pot -d translations``, translate, ``pybabel compile -d translations``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from flask import Flask, g, has_request_context, request
from flask_babel import Babel, format_decimal, get_locale, get_translations, gettext, lazy_pgettext
from flask_babel import lazy_gettext as _l
from flask_login import current_user

from webapp.resources import resource_dir
from workers.after_acceptance.bounces.reasons import find_reason
from workers.building import submitted
from workers.core.i18n import Text
from workers.core.states import Campaign

LANGUAGES = {"en": "English", "es": "Español"}
DEFAULT = "en"

# Words of the product's vocabulary shown as they are stored (states, kinds, reasons,
# roles, classes): `{{ value | label }}` shows them in the page's language.
VOCABULARY = {
    "pending": _l("pending"), "sending": _l("sending"), "retry": _l("retry"),
    "sent": _l("sent"), "failed": _l("failed"), "bounced": _l("bounced"),
    "skipped": _l("skipped"), "cancelled": _l("cancelled"), "held": _l("held"),
    "draft": _l("draft"), "scheduled": _l("scheduled"), "paused": _l("paused"),
    "broadcast": _l("broadcast"), "verification": _l("verification"), "test": _l("test"),
    "sequence": _l("sequence"), "subscription_confirmation": _l("subscription confirmation"),
    "unsubscribed": _l("unsubscribed"), "complaint": _l("complaint"), "manual": _l("manual"),
    "admin": _l("admin"), "marketer": _l("marketer"), "support": _l("support"),
    "hard_bounce": _l("hard bounce"), "rejected": _l("rejected"), "transient": _l("transient"),
    "build": _l("build"), "relay": _l("relay"), "ok": _l("ok"), "down": _l("down"),
    "active": _l("active"), "blocklisted": _l("blocklisted"), "unknown": _l("unknown"),
    "orphan": _l("orphan"), "dropped": _l("dropped"),
    "duplicate": _l("duplicate"), "suppressed": _l("suppressed"),
    "invalid address": _l("invalid address"), "invalid line": _l("invalid line"),
    "unclosed quote": _l("unclosed quote"),
    "problem": _l("problem"), "warning": _l("warning"),
    # where a bounce or complaint came from (job_events.source; providers keep their names)
    "mailbox": _l("bounce mailbox"), "generic": _l("generic webhook"),
    "critical": _l("critical"), "lifecycle": _l("lifecycle"), "complained": _l("complained"),
    "delivered": _l("delivered"), "relay_throttle": _l("relay throttle"),
    "domain_throttle": _l("domain throttle"), "sender": _l("sender refused"),
}
# The keys of an audit entry's details, as the audit page names them (unknown keys are
# shown as they are, "_" read as a space).
AUDIT_KEYS = {
    "added": _l("added"), "after": _l("after"), "algorithm": _l("algorithm"),
    "as_of": _l("as of"), "at": _l("at"), "before": _l("before"), "campaign": _l("campaign"),
    "created": _l("created"), "dedupe_window": _l("dedupe window"), "email": _l("email"),
    "event": _l("event"), "event_id": _l("event id"), "events": _l("events"),
    "expires_in_days": _l("expires in (days)"), "filters": _l("filters"),
    "flags": _l("flags"), "job_id": _l("job"), "job_ids": _l("jobs"), "jobs": _l("jobs"),
    "kind": _l("kind"), "kind_class": _l("class"), "class": _l("class"),
    "left_busy": _l("left out: busy"), "left_cancelled": _l("left out: cancelled"),
    "left_suppressed": _l("left out: suppressed"), "lines": _l("lines"), "list": _l("list"),
    "locale": _l("language"), "name": _l("name"), "new": _l("new"), "note": _l("note"),
    "old": _l("old"), "previous_job_id": _l("previous job"),
    "previous_status": _l("previous state"), "reason": _l("reason"),
    "remote_addr": _l("IP address"), "resend_cooldown": _l("resend cooldown"),
    "retried": _l("retried"), "retry_schedule": _l("retry schedule"), "reused": _l("reused"),
    "role": _l("role"), "selector": _l("selector"), "send_at": _l("send at"),
    "status": _l("state"), "subscriber": _l("subscriber"), "subscribers": _l("subscribers"),
    "updated": _l("updated"), "url": _l("URL"), "version": _l("version"),
    "q": _l("search"), "from": _l("from"), "to": _l("to"),
}
# A campaign's state as its badge says it: Spanish agrees with the noun (una campaña
# enviada, cancelada), where the words above agree with a job (un trabajo enviado).
CAMPAIGN_STATES = {
    Campaign.DRAFT: lazy_pgettext("campaign", "draft"),
    Campaign.SCHEDULED: lazy_pgettext("campaign", "scheduled"),
    Campaign.SENDING: lazy_pgettext("campaign", "sending"),
    Campaign.PAUSED: lazy_pgettext("campaign", "paused"),
    Campaign.CANCELLED: lazy_pgettext("campaign", "cancelled"),
    Campaign.SENT: lazy_pgettext("campaign", "sent"),
}
# A DKIM key's state (una clave activa, retirada).
KEY_STATES = {"active": lazy_pgettext("DKIM key", "active"),
              "next": lazy_pgettext("DKIM key", "next"),
              "retired": lazy_pgettext("DKIM key", "retired")}
# The built-in kinds' descriptions as the migrations store them (0014_kinds,
# 0027_marketers_subscription_forms): shown in the page's language until someone edits them.
BUILT_IN_DESCRIPTIONS = {
    "Signup verification (built in)": _l("Signup verification (built in)"),
    "Double opt-in: confirm a subscription made through a list form":
        _l("Double opt-in: confirm a subscription made through a list form"),
}
# What a bounce or complaint did (job_events.effect, written by the feedback intake).
FEEDBACK_EFFECTS = {
    "bounced": _l("job bounced, address suppressed"), "suppressed": _l("address suppressed"),
    "sender_alarm": _l("sender alarm raised"), "soft": _l("counted as a soft bounce"),
    "soft_suppressed": _l("suppressed after repeated soft bounces"),
    "complaint": _l("address suppressed as a complaint"), "ignored": _l("ignored"),
    "recorded": _l("recorded"), "duplicate": _l("already recorded"),
    "unmatched": _l("no job matched"),
}
# How each language writes a day (the rest of a strftime format is kept).
_DAY = {"en": "%Y-%m-%d", "es": "%d/%m/%Y"}


def current_language() -> str:
    locale = get_locale()
    return locale.language if locale is not None and locale.language in LANGUAGES \
        else DEFAULT


def select_locale() -> str:
    """The user's own setting, else the best of the browser's Accept-Language."""
    chosen = g.get("locale_override")
    if chosen in LANGUAGES:
        return str(chosen)
    if current_user and getattr(current_user, "is_authenticated", False):
        own = getattr(current_user, "locale", None)
        if own in LANGUAGES:
            return str(own)
    return request.accept_languages.best_match(list(LANGUAGES)) or DEFAULT


def num(value: Any, decimals: int | None = None) -> str:
    """A number as the page's language writes it (1,234.5 / 1.234,5)."""
    if value is None:
        return ""
    if decimals is None:
        return str(format_decimal(value, format="#,##0"))
    return str(format_decimal(value, format="#,##0." + "0" * decimals))


def dt(moment: datetime | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """A time (in UTC) as the page's language writes dates: the day part of ``fmt`` follows
    the language (2026-12-01 in English, 01/12/2026 in Spanish)."""
    if moment is None:
        return ""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime(fmt.replace("%Y-%m-%d", _DAY[current_language()]))


def label(value: Any) -> str:
    """A stored vocabulary word in the page's language (unknown words as they are)."""
    text = VOCABULARY.get(str(value))
    return str(text) if text is not None else str(value)


def kind_description(value: Any) -> str:
    """A kind's stored description: a built-in one in the page's language, any other as
    its author wrote it."""
    text = "" if value is None else str(value)
    built_in = BUILT_IN_DESCRIPTIONS.get(text)
    return str(built_in) if built_in is not None else text


_CANCELLED_BY = re.compile(r"cancelled by (?P<actor>.+)", re.S)


def job_note(value: Any) -> str:
    """A job's stored note (its last error) in the page's language where SendDock wrote it
    itself ("cancelled by …"); a relay's reply stays as the relay said it."""
    text = "" if value is None else str(value)
    found = _CANCELLED_BY.fullmatch(text)
    if found:
        return gettext("cancelled by %(actor)s", actor=found["actor"])
    return text


def audit_key(value: Any) -> str:
    """An audit detail's key in the page's language (a vocabulary word as ``label`` says
    it; anything else as it is, "_" read as a space)."""
    text = AUDIT_KEYS.get(str(value)) or VOCABULARY.get(str(value))
    return str(text) if text is not None else str(value).replace("_", " ")


# Bounce reasons (Sisimai's vocabulary: workers/after_acceptance/bounces/reasons.py) as
# people read them.
BOUNCE_REASONS = {
    "userunknown": _l("user unknown"), "hostunknown": _l("domain does not exist"),
    "hasmoved": _l("address has moved"), "notaccept": _l("domain accepts no mail"),
    "mailboxfull": _l("mailbox full"), "suspend": _l("mailbox suspended"),
    "filtered": _l("refused by the recipient's filter"),
    "spamdetected": _l("content seen as spam"), "virusdetected": _l("virus detected"),
    "policyviolation": _l("refused by the recipient's policy"),
    "contenterror": _l("content refused"), "notcompliantrfc": _l("message not RFC compliant"),
    "mesgtoobig": _l("message too big"), "exceedlimit": _l("message exceeds a limit"),
    "expired": _l("delivery time expired"), "systemerror": _l("recipient's server error"),
    "systemfull": _l("recipient's server full"), "networkerror": _l("network error"),
    "mailererror": _l("mail program error"), "syntaxerror": _l("SMTP syntax error"),
    "onhold": _l("undetermined failure"), "undefined": _l("undetermined failure"),
    "suppressed": _l("suppressed by the provider"),
    "blocked": _l("blocked by a blocklist"), "badreputation": _l("sender reputation too low"),
    "speeding": _l("sending too fast"), "toomanyconn": _l("too many connections"),
    "norelaying": _l("relaying denied"), "authfailure": _l("SPF/DKIM/DMARC failure"),
    "requireptr": _l("reverse DNS missing"), "rejected": _l("sender address refused"),
    "securityerror": _l("security or authentication error"),
    "failedstarttls": _l("TLS required"), "feedback": _l("complaint"),
    "delivered": _l("delivered"), "vacation": _l("auto-reply"),
}


def bounce_reason(value: Any) -> str:
    """A bounce's reason in the page's language: ``value`` is a stored reason code, or a
    reply text whose reason is found as the bounce reader finds it ('' for none)."""
    if not value:
        return ""
    text = BOUNCE_REASONS.get(str(value))
    if text is None:
        text = BOUNCE_REASONS.get(find_reason(str(value)[:2000]))
    return str(text) if text is not None else ""


def campaign_state(value: Any) -> str:
    """A campaign's stored state in the page's language (as its badge says it)."""
    text = CAMPAIGN_STATES.get(str(value))
    return str(text) if text is not None else label(value)


def feedback_effect(value: Any) -> str:
    """What a bounce or complaint did, in the page's language."""
    text = FEEDBACK_EFFECTS.get(str(value))
    return str(text) if text is not None else str(value)


def key_state(value: Any) -> str:
    """A DKIM key's stored state in the page's language."""
    text = KEY_STATES.get(str(value))
    return str(text) if text is not None else str(value)


def localize(message: Any) -> Any:
    """A message built by the domain code or the engine (:class:`workers.core.i18n.Text`) in
    the page's language; anything else as it is."""
    return message.say(gettext, num) if isinstance(message, Text) else message


def _request_translations() -> Any:
    """The request's catalogue, looked up on its first use in the request."""
    if not has_request_context():
        return get_translations()
    translations = getattr(request, "senddock_translations", None)
    if translations is None:
        translations = get_translations()
        request.senddock_translations = translations  # type: ignore[attr-defined]
    return translations


def init_app(app: Flask) -> None:
    app.config.setdefault("BABEL_DEFAULT_LOCALE", DEFAULT)
    app.config["BABEL_TRANSLATION_DIRECTORIES"] = str(resource_dir("translations"))
    Babel(app, locale_selector=select_locale)
    # Flask-Babel looks the request's translations up again for every string a template
    # translates (three context lookups and the locale's name each time): a page like Queue
    # health translates hundreds. The request's locale is fixed once chosen (Flask-Babel
    # keeps it on the request's context too), so the catalogue is looked up once per request.
    app.jinja_env.install_gettext_callables(  # type: ignore[attr-defined]
        gettext=lambda s: _request_translations().ugettext(s),
        ngettext=lambda s, p, n: _request_translations().ungettext(s, p, n),
        newstyle=True,
        pgettext=lambda c, s: _request_translations().upgettext(c, s),
        npgettext=lambda c, s, p, n: _request_translations().unpgettext(c, s, p, n))
    app.jinja_env.filters.update(num=num, dt=dt, label=label, localize=localize,
                                 campaign_state=campaign_state, key_state=key_state,
                                 feedback_effect=feedback_effect,
                                 audit_key=audit_key, bounce_reason=bounce_reason,
                                 job_note=job_note, kind_description=kind_description,
                                 submission_source=submitted.source)
    # Every {{ value }} a template prints passes here: a domain message (an error, a
    # field's problem, a check's verdict) shows in the page's language wherever it goes.
    app.jinja_env.finalize = localize
    app.jinja_env.globals.update(languages=LANGUAGES, current_language=current_language)
