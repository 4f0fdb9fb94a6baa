"""The relays of ``SENDDOCK_SMTP_URL`` (docs/design.md §16, §17): one SMTP URL, or several
with roles and names, parsed into :class:`RelaySpec` and :class:`SmtpConfig`. In core because
the settings check the URL at start-up; :mod:`workers.delivery.smtp` talks to the relays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

TLS_MODES = ("none", "starttls", "ssl")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class SmtpConfig:
    """Where and how to reach the relay. ``password`` never appears in repr()."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: str = "none"
    verify: bool = True
    tls_explicit: bool = field(default=False, compare=False)  # ?tls=... or smtps:// given

    def redacted(self) -> str:
        """The config as a URL that is safe to log: the password is masked."""
        auth = ""
        if self.username is not None:
            auth = quote(self.username, safe="") + (":***" if self.password else "") + "@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"?tls={self.tls}" + ("" if self.verify else "&verify=false")
        return f"smtp://{auth}{host}:{self.port}{query}"


def _parse_bool(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"SMTP URL: {name}={value!r} must be true or false")


def _parse_query(query: str, scheme: str) -> tuple[str, bool, bool]:
    tls = "ssl" if scheme == "smtps" else "none"
    verify = True
    explicit = scheme == "smtps"
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name == "tls":
            explicit = True
            if value not in TLS_MODES:
                raise ValueError(f"SMTP URL: tls={value!r} must be one of {', '.join(TLS_MODES)}")
            if scheme == "smtps" and value != "ssl":
                raise ValueError("SMTP URL: smtps:// always uses tls=ssl")
            tls = value
        elif name == "verify":
            verify = _parse_bool(name, value)
        else:
            raise ValueError(f"SMTP URL: unknown parameter {name!r} (known: tls, verify; "
                             "a private CA is SENDDOCK_SMTP_CA_FILE)")
    return tls, verify, explicit


def parse_smtp_url(url: str) -> SmtpConfig:
    """Parse ``smtp://[user:password@]host[:port][?tls=none|starttls|ssl&verify=false]``.

    Guarantees: credentials are percent-decoded; ``smtps://`` means tls=ssl;
    the port defaults to 465 for ssl and 25 otherwise; tls defaults to none, but
    credentials are never sent over an unencrypted connection unless the URL says
    ``tls=none`` itself. Raises ValueError with a one-line message naming the problem
    (never echoing the password) for anything else.
    """
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        raise ValueError("SMTP URL is not a valid URL (is the port a number? are special "
                         "characters in the password percent-encoded?)") from None
    if parts.scheme not in ("smtp", "smtps"):
        raise ValueError(f"SMTP URL must start with smtp:// or smtps://, got {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError("SMTP URL has no host name")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError("SMTP URL must not have a path or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("SMTP URL port must be a number from 1 to 65535") from None
    tls, verify, explicit = _parse_query(parts.query, parts.scheme)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if password is not None and username is None:
        raise ValueError("SMTP URL has a password but no user name")
    if username is not None and tls == "none" and not explicit:
        raise ValueError("SMTP URL has credentials but no encryption: add ?tls=starttls "
                         "(or ?tls=ssl), or ?tls=none to send them in the clear on purpose")
    if port == 0:
        raise ValueError("SMTP URL port must be a number from 1 to 65535")
    return SmtpConfig(
        host=parts.hostname,
        port=port or (465 if tls == "ssl" else 25),
        username=username,
        password=password,
        tls=tls,
        verify=verify,
        tls_explicit=explicit,
    )


# --- several relays (docs/design.md §17) ----------------------------------------------------------

#: A relay's role: which stream it carries first. Every relay is also the failover of the
#: other stream (after that stream's own relays), so mail goes out while any relay works.
ROLES = ("all", "transactional", "campaign")
STREAMS = ("transactional", "campaign")
_RELAY_SPLIT = re.compile(r"[\s,]+(?=smtps?://)")
_RELAY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


@dataclass(frozen=True)
class RelaySpec:
    """One relay of ``SENDDOCK_SMTP_URL``: its place in the list (1-based: the failover
    order and the ``relay_state`` row), name, role and connection settings. ``url`` is the
    URL as configured (hashed for the fingerprint, never shown)."""

    index: int
    name: str
    role: str
    smtp: SmtpConfig
    url: str = field(repr=False)

    def serves(self, stream: str) -> bool:
        return self.role in ("all", stream)


def parse_relays(raw: str) -> list[RelaySpec]:
    """Parse ``SENDDOCK_SMTP_URL``: one relay URL, or several separated by commas or
    whitespace, each with an optional ``role=all|transactional|campaign`` (default all)
    and ``name=`` (default host:port) in its query, e.g. ``smtp://tx.example:587?tls=
    starttls&role=transactional smtp://bulk.example:587?tls=starttls&role=campaign``.

    Guarantees: at least one relay, names unique, each URL as :func:`parse_smtp_url`
    accepts it. Raises ValueError with a one-line message naming the relay (by its place
    in the list when there are several) and the problem, never echoing a password."""
    urls = [u for u in _RELAY_SPLIT.split(raw.strip()) if u]
    if not urls:
        raise ValueError("SMTP URL is empty")
    relays: list[RelaySpec] = []
    for index, url in enumerate(urls, start=1):
        where = f"relay {index}: " if len(urls) > 1 else ""
        parts = urlsplit(url)
        kept, role, name = [], "all", ""
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key == "role":
                role = value
            elif key == "name":
                name = value
            else:
                kept.append(f"{quote(key, safe='')}={quote(value, safe='')}")
        if role not in ROLES:
            raise ValueError(f"SMTP URL: {where}role={role!r} must be one of "
                             f"{', '.join(ROLES)}")
        if name and not _RELAY_NAME.fullmatch(name):
            raise ValueError(f"SMTP URL: {where}name={name!r} must be 1-40 letters, digits, "
                             "'.', '_' or '-'")
        try:
            smtp = parse_smtp_url(parts._replace(query="&".join(kept)).geturl())
        except ValueError as exc:
            if not where:
                raise
            problem = str(exc).removeprefix("SMTP URL").lstrip(": ")
            raise ValueError(f"SMTP URL: {where}{problem}") from None
        name = name or (f"{smtp.host}:{smtp.port}" if len(urls) > 1 else "relay")
        if any(r.name == name for r in relays):
            raise ValueError(f"SMTP URL: {where}the name {name!r} is used twice "
                             "(add name=... to tell them apart)")
        relays.append(RelaySpec(index, name, role, smtp, url))
    return relays


def route(relays: list[RelaySpec], stream: str) -> list[RelaySpec]:
    """The relays to try for ``stream``, in order: those whose role serves it (in the
    configured order), then the others as failover."""
    return ([r for r in relays if r.serves(stream)]
            + [r for r in relays if not r.serves(stream)])
