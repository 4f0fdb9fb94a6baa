"""Is a sending domain ready for Gmail, Yahoo and Microsoft's bulk-sender rules?

Each check asks DNS (dnspython, through ``SENDDOCK_DNS_RESOLVER`` when it is set, so the
tests ask a local server) and answers with a :class:`Check`: ``ok``, ``warning`` (mail
goes out but some receivers will like it less) or ``problem`` (mail will fail SPF, DKIM or
DMARC somewhere), a verdict in plain words and, when something must change, the record to
publish. The same checks serve the *Sending domains* page, the campaign review page and
``senddock check``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

import dns.exception
import dns.rdata
import dns.resolver
from publicsuffixlist import PublicSuffixList

from workers.building.dkim import KeyRecord, signing_domain
from workers.core.addresses import domain_of
from workers.core.i18n import N_, Text, message_of

OK, WARNING, PROBLEM = "ok", "warning", "problem"
SPF_LOOKUP_LIMIT = 10  # RFC 7208 4.6.4: more DNS-querying terms is a permerror
FREE_MAIL_DOMAINS = frozenset({
    "gmail.com", "googlemail.com", "yahoo.com", "yahoo.co.uk", "yahoo.fr", "yahoo.de",
    "yahoo.es", "ymail.com", "rocketmail.com", "outlook.com", "hotmail.com", "hotmail.co.uk",
    "hotmail.fr", "hotmail.es", "live.com", "msn.com", "aol.com", "icloud.com", "me.com",
    "mac.com", "gmx.com", "gmx.de", "gmx.net", "web.de", "yandex.com", "yandex.ru",
    "mail.ru", "proton.me", "protonmail.com", "zoho.com", "mail.com", "fastmail.com",
    "tutanota.com", "qq.com", "163.com", "126.com", "naver.com", "orange.fr", "free.fr",
    "laposte.net", "libero.it", "t-online.de", "seznam.cz", "wp.pl", "o2.pl", "terra.com.br",
    "uol.com.br", "bol.com.br",
})


@dataclass(frozen=True)
class Check:
    """One verdict: ``name`` (what was checked), ``status``, ``verdict`` in plain words,
    ``fix`` (the record to publish or the thing to do) when the status is not ok."""

    name: str
    status: str
    verdict: str
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class DomainReport:
    domain: str
    checks: list[Check] = field(default_factory=list)

    @property
    def status(self) -> str:
        statuses = {check.status for check in self.checks}
        return PROBLEM if PROBLEM in statuses else WARNING if WARNING in statuses else OK

    @property
    def problems(self) -> list[Check]:
        return [check for check in self.checks if check.status == PROBLEM]


class DnsError(Exception):
    """DNS could not be asked (timeout, server failure): says nothing about the record."""


# -- DNS -----------------------------------------------------------------------------


def make_resolver(setting: str | None, timeout: float = 3.0) -> dns.resolver.Resolver:
    """A resolver for ``SENDDOCK_DNS_RESOLVER`` (``host[:port][,host[:port]]``, IPv6 as
    ``[::1]:53``), the system's (/etc/resolv.conf) when it is unset. Raises ValueError
    naming the variable for a value that is not an address."""
    if not setting:
        resolver = dns.resolver.Resolver()
    else:
        resolver = dns.resolver.Resolver(configure=False)
        servers: list[str] = []
        port = 53
        for item in (part.strip() for part in setting.split(",")):
            host, port_text = item, ""
            if item.startswith("["):
                host, closed, rest = item[1:].partition("]")
                host = host if closed else ""
                port_text = rest.removeprefix(":")
            elif item.count(":") == 1:
                host, port_text = item.split(":")
            try:
                ipaddress.ip_address(host)
                port = int(port_text) if port_text else port
            except ValueError:
                raise ValueError(f"SENDDOCK_DNS_RESOLVER: {item!r} is not an IP address with "
                                 "an optional :port") from None
            servers.append(host)
        resolver.nameservers = servers
        resolver.port = port
    resolver.lifetime = timeout
    resolver.timeout = timeout
    return resolver


def _query(resolver: dns.resolver.Resolver, name: str, rtype: str) -> list[dns.rdata.Rdata]:
    """The records, [] when the name or the type does not exist; DnsError when DNS fails."""
    try:
        return list(resolver.resolve(name, rtype, raise_on_no_answer=False,
                                     search=False) or [])
    except dns.resolver.NXDOMAIN:
        return []
    except (dns.exception.Timeout, dns.resolver.NoNameservers) as exc:
        raise DnsError(N_("DNS did not answer for %(name)s %(type)s: %(why)s", name=name,
                          type=rtype, why=str(exc))) from None


def txt_records(resolver: dns.resolver.Resolver, name: str) -> list[str]:
    """Each TXT record at ``name`` with its strings joined (RFC 7208 3.3, RFC 6376 3.6.2.2)."""
    return [b"".join(r.strings).decode("utf-8", "replace")  # type: ignore[attr-defined]
            for r in _query(resolver, name, "TXT")]


def _addresses(resolver: dns.resolver.Resolver, name: str) -> list[str]:
    return [r.to_text() for rtype in ("A", "AAAA") for r in _query(resolver, name, rtype)]


@functools.cache
def _psl() -> PublicSuffixList:
    return PublicSuffixList()


def organizational_domain(domain: str) -> str:
    """The registered domain (``news.example.co.uk`` → ``example.co.uk``), from the Public
    Suffix List shipped with ``publicsuffixlist``: what DMARC's relaxed alignment compares."""
    domain = domain.lower().rstrip(".")
    return _psl().privatesuffix(domain) or domain


def aligned(a: str, b: str, strict: bool = False) -> bool:
    if strict:
        return a.lower().rstrip(".") == b.lower().rstrip(".")
    return organizational_domain(a) == organizational_domain(b)


def is_free_mail(domain: str) -> bool:
    return domain.lower().rstrip(".") in FREE_MAIL_DOMAINS


def tags(record: str) -> dict[str, str]:
    """``k=v; k=v`` tag lists (DKIM, DMARC) as a dict; names lower-cased, values stripped."""
    result: dict[str, str] = {}
    for part in record.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            result.setdefault(name.strip().lower(), "".join(value.split()))
    return result


# -- SPF (RFC 7208, the mechanisms real records use) ---------------------------------


class _SpfBudget:
    def __init__(self) -> None:
        self.lookups = 0

    def spend(self) -> None:
        self.lookups += 1
        if self.lookups > SPF_LOOKUP_LIMIT:
            raise _SpfPermError(f"more than {SPF_LOOKUP_LIMIT} DNS lookups (RFC 7208 4.6.4)")


class _SpfPermError(Exception):
    pass


def spf_record(resolver: dns.resolver.Resolver, domain: str) -> list[str]:
    return [r for r in txt_records(resolver, domain)
            if r.lower() == "v=spf1" or r.lower().startswith("v=spf1 ")]


def _in_network(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, address: str,
                cidr4: int, cidr6: int) -> bool:
    candidate = ipaddress.ip_address(address)
    if candidate.version != ip.version:
        return False
    prefix = cidr4 if ip.version == 4 else cidr6
    return ip in ipaddress.ip_network(f"{candidate}/{prefix}", strict=False)


def _split_cidr(value: str) -> tuple[str, int, int]:
    """``domain/24//64`` → (domain, 24, 64)."""
    cidr4, cidr6 = 32, 128
    if "//" in value:
        value, six = value.split("//", 1)
        cidr6 = int(six)
    if "/" in value:
        value, four = value.split("/", 1)
        cidr4 = int(four)
    return value, cidr4, cidr6


_QUALIFIERS = {"+": "pass", "-": "fail", "~": "softfail", "?": "neutral"}


def spf_evaluate(resolver: dns.resolver.Resolver, domain: str, ip: str,
                 budget: _SpfBudget | None = None) -> str:
    """RFC 7208 check_host() for ``ip`` sending as ``domain``: pass, fail, softfail,
    neutral, none or permerror. Supports all, include, a, mx, ip4, ip6, exists, redirect;
    ``ptr`` never matches (RFC 7208 says do not use it); macros are a permerror here
    (SendDock cannot expand them without the message)."""
    budget = budget or _SpfBudget()
    records = spf_record(resolver, domain)
    if not records:
        return "none"
    if len(records) > 1:
        return "permerror"
    address = ipaddress.ip_address(ip)
    redirect = None
    try:
        for term in records[0].split()[1:]:
            if "%" in term:
                raise _SpfPermError("macros")
            lowered = term.lower()
            if lowered.startswith("redirect="):
                redirect = term.split("=", 1)[1]
                continue
            if "=" in lowered.split(":")[0]:
                continue  # another modifier (exp=...)
            qualifier = _QUALIFIERS.get(term[0], None)
            mechanism = term[1:] if qualifier else term
            result = _mechanism(resolver, domain, address, mechanism, budget)
            if result is True:
                return qualifier or "pass"
            if isinstance(result, str):
                return result
        if redirect:
            budget.spend()
            outcome = spf_evaluate(resolver, redirect, ip, budget)
            return "permerror" if outcome == "none" else outcome
    except _SpfPermError:
        return "permerror"
    return "neutral"


def _mechanism(resolver: dns.resolver.Resolver, domain: str,
               ip: ipaddress.IPv4Address | ipaddress.IPv6Address, mechanism: str,
               budget: _SpfBudget) -> bool | str:
    """True on a match, False otherwise, a result string when an include decides."""
    name, _, argument = mechanism.partition(":")
    name = name.lower()
    if name.startswith(("a/", "mx/")):
        name, argument = name.split("/", 1)[0], domain + "/" + name.split("/", 1)[1]
    if name == "all":
        return True
    if name in ("ip4", "ip6"):
        network = ipaddress.ip_network(argument, strict=False)
        return network.version == ip.version and ip in network
    if name == "include":
        budget.spend()
        outcome = spf_evaluate(resolver, argument, str(ip), budget)
        if outcome in ("none", "permerror"):
            raise _SpfPermError(f"include:{argument} has no usable SPF record")
        return outcome == "pass"
    if name in ("a", "mx"):
        budget.spend()
        target, cidr4, cidr6 = _split_cidr(argument or domain)
        target = target or domain
        hosts = [target] if name == "a" else [
            r.exchange.to_text().rstrip(".")  # type: ignore[attr-defined]
            for r in _query(resolver, target, "MX")]
        return any(_in_network(ip, address, cidr4, cidr6)
                   for host in hosts for address in _addresses(resolver, host))
    if name == "exists":
        budget.spend()
        return bool(_query(resolver, argument, "A"))
    if name == "ptr":
        budget.spend()
        return False
    raise _SpfPermError(f"unknown mechanism {name}")


def spf_includes(resolver: dns.resolver.Resolver, domain: str, include: str,
                 depth: int = 0) -> bool:
    """Whether ``domain``'s SPF reaches ``include:<include>`` (directly, through nested
    includes or a redirect)."""
    if depth > SPF_LOOKUP_LIMIT:
        return False
    for record in spf_record(resolver, domain)[:1]:
        for term in record.split()[1:]:
            lowered = term.lower().lstrip("+-~?")
            for prefix in ("include:", "redirect="):
                if lowered.startswith(prefix):
                    target = lowered[len(prefix):].rstrip(".")
                    if target == include.lower().rstrip(".") or spf_includes(
                            resolver, target, include, depth + 1):
                        return True
    return False


def _all_qualifier(record: str) -> str | None:
    for term in record.split()[1:]:
        if term.lower().lstrip("+-~?") == "all":
            return term[0] if term[0] in "+-~?" else "+"
    return None


# -- the checks ----------------------------------------------------------------------


def check_spf(resolver: dns.resolver.Resolver, domain: str, relay_host: str,
              spf_include: str | None = None) -> Check:
    """SPF of the envelope (bounce) domain: one record, it authorises the relay (its
    include, or its address), it ends in -all or ~all."""
    name = N_("SPF of %(domain)s", domain=domain)
    example = f"include:{spf_include}" if spf_include else N_("ip4:<your relay's address>")
    fix_record = N_('%(domain)s. 3600 IN TXT "v=spf1 %(example)s -all"', domain=domain,
                    example=example)
    records = spf_record(resolver, domain)
    if not records:
        return Check(name, PROBLEM, N_("%(domain)s has no SPF record: receivers cannot tell "
                                       "that your relay may send for it.", domain=domain),
                     _publish(fix_record))
    if len(records) > 1:
        return Check(name, PROBLEM, N_("%(domain)s has %(count)s SPF records; receivers treat "
                                       "that as an error (permerror).", domain=domain,
                                       count=len(records)),
                     N_("merge them into one TXT record"))
    record = records[0]
    qualifier = _all_qualifier(record)
    if qualifier == "+":
        return Check(name, PROBLEM, N_("the SPF record of %(domain)s ends in +all: it lets "
                                       "anyone send as you.", domain=domain),
                     N_("end it with -all or ~all: %(record)s", record=fix_record))
    authorised, verdict = _spf_authorises(resolver, domain, record, relay_host, spf_include)
    if authorised is False:
        return Check(name, PROBLEM, verdict, N_("add %(example)s to the record: %(record)s",
                                                example=example, record=fix_record))
    if qualifier is None and "redirect=" not in record.lower():
        return Check(name, WARNING, N_("%(verdict)s But it does not end in -all or ~all, so "
                                       "it does not say that other servers may not send as "
                                       "you.", verdict=verdict),
                     N_("end the record with -all (or ~all): %(record)s -all", record=record))
    if authorised is None:
        return Check(name, WARNING, verdict, N_("make sure SPF covers the relay's public "
                                                "address, or set SENDDOCK_SPF_INCLUDE to "
                                                "your provider's include"))
    return Check(name, OK, verdict)


def _publish(record: str) -> Text:
    return N_("publish %(record)s", record=record)


def _spf_authorises(resolver: dns.resolver.Resolver, domain: str, record: str,
                    relay_host: str, spf_include: str | None) -> tuple[bool | None, Text]:
    """(True/False, verdict) when it can tell; (None, verdict) when the relay's public
    address cannot be known from here."""
    if spf_include:
        if spf_includes(resolver, domain, spf_include):
            return True, N_("SPF of %(domain)s includes %(include)s.", domain=domain,
                            include=spf_include)
        return False, N_("SPF of %(domain)s does not include %(include)s, your relay's "
                         "include.", domain=domain, include=spf_include)
    try:
        addresses = [str(ipaddress.ip_address(relay_host))]
    except ValueError:
        addresses = _addresses(resolver, relay_host)
    if not addresses:
        return None, N_("the relay's host %(host)s has no address in DNS, so SendDock cannot "
                        "tell whether SPF authorises it.", host=relay_host)
    results = {address: spf_evaluate(resolver, domain, address) for address in addresses}
    listed = ", ".join(addresses)
    if any(result == "pass" for result in results.values()):
        return True, N_("SPF of %(domain)s authorises the relay (%(addresses)s).",
                        domain=domain, addresses=listed)
    if "permerror" in results.values():
        return False, N_("the SPF record of %(domain)s cannot be evaluated (permerror: too "
                         "many lookups, a broken include or macros).", domain=domain)
    private = all(ipaddress.ip_address(a).is_private or ipaddress.ip_address(a).is_loopback
                  for a in addresses)
    if private:
        return None, N_("SPF of %(domain)s does not list the relay's address %(addresses)s, "
                        "a private address: receivers see the relay's public address "
                        "instead, which SendDock cannot know.", domain=domain,
                        addresses=listed)
    return False, N_("SPF of %(domain)s does not authorise the relay (%(addresses)s): result "
                     "%(results)s.", domain=domain, addresses=listed,
                     results=", ".join(sorted(set(results.values()))))


def check_dkim_key(resolver: dns.resolver.Resolver, key: KeyRecord) -> Check:
    """The record at ``selector._domainkey.domain`` is this key (same k= and p=)."""
    name = N_("DKIM key %(record)s", record=key.record_name)
    where = key.record_name
    publish = _publish(key.zone_line)
    severity = PROBLEM if key.status == "active" else WARNING
    if key.status == "retired":
        return Check(name, OK, N_("retired key: keep its record a few days after the "
                                  "rotation so mail in flight still verifies, then delete "
                                  "both."))
    records = [r for r in txt_records(resolver, key.record_name)
               if tags(r).get("v", "DKIM1") == "DKIM1"]
    if not records:
        return Check(name, severity, N_(
            "no DKIM record is published at %(record)s, but mail is signed with it: "
            "receivers will fail DKIM.", record=where) if key.status == "active" else N_(
            "no DKIM record is published at %(record)s, but it signs nothing yet: receivers "
            "will fail DKIM.", record=where), publish)
    if len(records) > 1:
        return Check(name, severity, N_("%(record)s has %(count)s DKIM records; receivers may "
                                        "pick the wrong one.", record=where,
                                        count=len(records)),
                     N_("keep only one: %(publish)s", publish=publish))
    found = tags(records[0])
    if not found.get("p"):
        return Check(name, severity, N_("the record at %(record)s revokes the key (empty "
                                        "p=).", record=where), publish)
    if found.get("k", "rsa") != key.algorithm or found["p"] != key.public_key:
        return Check(name, severity, N_("the record at %(record)s is a different key than "
                                        "the one SendDock signs with: receivers will fail "
                                        "DKIM.", record=where),
                     N_("replace it: %(record)s", record=key.zone_line))
    if key.status == "next":
        return Check(name, OK, N_("the next key is published: it can be activated."))
    return Check(name, OK, N_("published and matches the key mail is signed with "
                              "(%(algorithm)s).", algorithm=key.algorithm))


def dmarc_record(resolver: dns.resolver.Resolver, domain: str) -> tuple[str | None, list[str]]:
    """(where, records): ``_dmarc.<domain>``, else the organisational domain's (RFC 7489
    6.6.3)."""
    for candidate in dict.fromkeys([domain, organizational_domain(domain)]):
        records = [r for r in txt_records(resolver, f"_dmarc.{candidate}")
                   if r.replace(" ", "").lower().startswith("v=dmarc1")]
        if records:
            return candidate, records
    return None, []


def check_dmarc(resolver: dns.resolver.Resolver, domain: str) -> tuple[Check, dict[str, str]]:
    """A DMARC record exists (Gmail and Yahoo require one of bulk senders) and its policy."""
    name = N_("DMARC of %(domain)s", domain=domain)
    org = organizational_domain(domain)
    fix = _publish(f'_dmarc.{org}. 3600 IN TXT "v=DMARC1; p=none; rua=mailto:dmarc@{org}"')
    where, records = dmarc_record(resolver, domain)
    if not records:
        return Check(name, PROBLEM, N_("no DMARC record for %(domain)s: Gmail and Yahoo "
                                       "require one of bulk senders.", domain=domain), fix), {}
    if len(records) > 1:
        return Check(name, PROBLEM, N_("_dmarc.%(where)s has %(count)s DMARC records; "
                                       "receivers ignore them all.", where=where,
                                       count=len(records)), N_("keep only one")), {}
    policy = tags(records[0])
    p = policy.get("p", "").lower()
    if p not in ("none", "quarantine", "reject"):
        return Check(name, PROBLEM, N_("the DMARC record at _dmarc.%(where)s has no valid "
                                       "policy (p=%(policy)s).", where=where,
                                       policy=p or N_("missing")), fix), policy
    if p == "none":
        return Check(name, OK, N_("DMARC record at _dmarc.%(where)s, policy none (monitoring "
                                  "only): enough for Gmail and Yahoo; move to quarantine once "
                                  "the reports are clean.", where=where)), policy
    return Check(name, OK, N_("DMARC record at _dmarc.%(where)s, policy %(policy)s.",
                              where=where, policy=p)), policy


def check_dkim_alignment(domain: str, signer: str | None, policy: dict[str, str]) -> Check:
    """DMARC passes on DKIM only when ``d=`` aligns with the From domain."""
    name = N_("DKIM alignment of %(domain)s", domain=domain)
    strict = policy.get("adkim", "r").lower() == "s"
    if signer is None:
        return Check(name, PROBLEM, N_("mail From %(domain)s goes out unsigned: DMARC cannot "
                                       "pass on DKIM.", domain=domain),
                     N_("create a key: senddock dkim create %(domain)s", domain=domain))
    if aligned(domain, signer, strict):
        return Check(name, OK, N_("signed with d=%(signer)s, aligned with the From domain "
                                  "(strict).", signer=signer) if strict else
                     N_("signed with d=%(signer)s, aligned with the From domain.",
                        signer=signer))
    return Check(name, PROBLEM, N_("signed with d=%(signer)s, but DMARC asks for strict "
                                   "alignment (adkim=s) with %(domain)s.", signer=signer,
                                   domain=domain),
                 N_("create a key for %(domain)s itself: senddock dkim create %(domain)s",
                    domain=domain))


def check_bounce(resolver: dns.resolver.Resolver, domain: str, bounce_address: str,
                 policy: dict[str, str]) -> list[Check]:
    """The bounce (envelope) domain aligns with the From domain for SPF, and has an MX so
    bounces reach the bounce mailbox."""
    bounce_domain = domain_of(bounce_address)
    checks = []
    strict = policy.get("aspf", "r").lower() == "s"
    name = N_("bounce domain alignment of %(domain)s", domain=domain)
    if aligned(domain, bounce_domain, strict):
        checks.append(Check(name, OK, N_("the bounce address %(address)s is on an aligned "
                                         "domain, so SPF counts for DMARC.",
                                         address=bounce_address)))
    else:
        checks.append(Check(name, WARNING, N_(
            "the bounce address %(address)s is not on %(domain)s's domain: SPF cannot count "
            "for DMARC, which then rests on DKIM alone.", address=bounce_address,
            domain=domain), N_("use a bounce address on %(domain)s (SENDDOCK_BOUNCE_ADDRESS)",
                               domain=organizational_domain(domain))))
    checks.append(check_mx(resolver, bounce_domain))
    return checks


def check_mx(resolver: dns.resolver.Resolver, domain: str) -> Check:
    name = N_("MX of %(domain)s", domain=domain)
    records = _query(resolver, domain, "MX")
    exchanges = [r.exchange.to_text() for r in records]  # type: ignore[attr-defined]
    publish_mx = _publish(N_("%(domain)s. 3600 IN MX 10 <your bounce mailbox's server>.",
                             domain=domain))
    if exchanges == ["."]:
        return Check(name, PROBLEM, N_("%(domain)s publishes a null MX: it accepts no mail, "
                                       "so bounces cannot come back.", domain=domain),
                     publish_mx)
    if exchanges:
        return Check(name, OK, N_("bounces reach %(exchanges)s.",
                                  exchanges=", ".join(sorted(exchanges))))
    if _addresses(resolver, domain):
        return Check(name, WARNING, N_("%(domain)s has no MX record; bounces go to its A "
                                       "record's host, which may not accept mail.",
                                       domain=domain), publish_mx)
    return Check(name, PROBLEM, N_("%(domain)s has no MX and no address: bounces cannot be "
                                   "delivered.", domain=domain), publish_mx)


def check_domain(resolver: dns.resolver.Resolver, domain: str, keys: Sequence[KeyRecord], *,
                 relay_host: str, bounce_address: str | None = None,
                 spf_include: str | None = None) -> DomainReport:
    """Every check for mail From ``domain``: SPF of the envelope domain, each DKIM key's
    record, DMARC and its policy, DKIM and bounce-domain alignment, MX of the bounce
    domain. ``keys`` are the stored keys (all domains: a parent's key may sign). A DNS
    failure becomes a problem saying DNS did not answer, never a crash."""
    domain = domain.lower().rstrip(".")
    envelope = bounce_address or f"postmaster@{domain}"
    envelope_domain = domain_of(envelope)
    report = DomainReport(domain)
    try:
        if is_free_mail(domain):
            report.checks.append(Check(
                N_("From domain %(domain)s", domain=domain), PROBLEM,
                N_("%(domain)s is a free-mail domain: its DMARC policy rejects mail sent from "
                   "other servers.", domain=domain), N_("send From a domain you own")))
        report.checks.append(check_spf(resolver, envelope_domain, relay_host, spf_include))
        active = {k.domain for k in keys if k.status == "active"}
        signer = signing_domain(domain, active)
        own = [k for k in keys if k.domain == (signer or domain)]
        report.checks.extend(check_dkim_key(resolver, key) for key in own
                             if key.status != "retired")
        if signer and all(k.algorithm == "ed25519" for k in own if k.status == "active"):
            report.checks.append(Check(
                N_("DKIM algorithm of %(domain)s", domain=signer), WARNING,
                N_("only an ed25519 key signs: Gmail does not verify ed25519 yet."),
                N_("add an RSA key: senddock dkim create %(domain)s --algorithm rsa",
                   domain=signer)))
        dmarc, policy = check_dmarc(resolver, domain)
        report.checks.append(dmarc)
        report.checks.append(check_dkim_alignment(domain, signer, policy))
        if bounce_address:
            report.checks.extend(check_bounce(resolver, domain, bounce_address, policy))
    except DnsError as exc:
        report.checks.append(Check(
            N_("DNS for %(domain)s", domain=domain), PROBLEM, message_of(exc),
            N_("check SENDDOCK_DNS_RESOLVER and that the DNS server answers")))
    return report

