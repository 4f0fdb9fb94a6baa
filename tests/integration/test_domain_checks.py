"""Sending-domain checks against a real DNS server (dnslib on loopback) serving the zone
each test writes: every problem the checks can name, and the all-clear."""

from __future__ import annotations

from datetime import UTC, datetime

import dkim
import pytest

from harness.dns import DnsServer
from webapp.domain import domain_checks as dc
from workers.building import dkim as sd

DOMAIN = "example.com"
RSA = sd.generate_private_key("rsa")
ED = sd.generate_private_key("ed25519")


def key_record(alg: str = "rsa", selector: str = "sd1", status: str = "active",
               domain: str = DOMAIN) -> sd.KeyRecord:
    key = RSA if alg == "rsa" else ED
    return sd.KeyRecord(id=1, domain=domain, selector=selector, algorithm=alg, status=status,
                        public_key=sd.public_key_b64(key), created_at=datetime.now(UTC),
                        activated_at=None)


def publish_good(dns_server: DnsServer, key: sd.KeyRecord) -> None:
    zone = dns_server.zone
    zone.txt(DOMAIN, "v=spf1 ip4:127.0.0.0/8 -all", "google-site-verification=abc")
    zone.txt(key.record_name, key.record_value)
    zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=quarantine; rua=mailto:d@example.com")
    zone.add(DOMAIN, "MX", "mx.example.com")
    zone.add("mx.example.com", "A", "127.0.0.1")


def report(dns_server: DnsServer, keys: list[sd.KeyRecord] | None = None,
           **kwargs: str) -> dc.DomainReport:
    resolver = dc.make_resolver(dns_server.resolver_setting)
    domain = kwargs.pop("domain", DOMAIN)
    options = {"relay_host": "127.0.0.1", "bounce_address": f"bounces@{DOMAIN}"}
    options.update(kwargs)
    return dc.check_domain(resolver, domain,
                           [key_record()] if keys is None else keys, **options)


def by_name(result: dc.DomainReport, prefix: str) -> dc.Check:
    matches = [c for c in result.checks if c.name.startswith(prefix)]
    assert len(matches) == 1, result.checks
    return matches[0]


def test_a_ready_domain_passes_every_check_asked_of_the_local_server(
        dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    result = report(dns_server, [key])
    assert result.status == dc.OK, result.checks
    names = [c.name for c in result.checks]
    assert names == ["SPF of example.com", "DKIM key sd1._domainkey.example.com",
                     "DMARC of example.com", "DKIM alignment of example.com",
                     "bounce domain alignment of example.com", "MX of example.com"]
    # The long RSA record came over TCP after a truncated UDP answer; all from this server.
    assert dns_server.asked("sd1._domainkey.example.com", "TXT")
    assert dns_server.asked("_dmarc.example.com", "TXT")


def test_missing_records_are_each_named_with_the_record_to_publish(
        dns_server: DnsServer) -> None:
    key = key_record()
    result = report(dns_server, [key])
    spf = by_name(result, "SPF")
    assert spf.status == dc.PROBLEM and "no SPF record" in spf.verdict
    assert spf.fix and 'TXT "v=spf1 ip4:' in spf.fix
    dkim_check = by_name(result, "DKIM key")
    assert dkim_check.status == dc.PROBLEM and "no DKIM record" in dkim_check.verdict
    assert dkim_check.fix == f"publish {key.zone_line}"
    dmarc = by_name(result, "DMARC")
    assert dmarc.status == dc.PROBLEM and "Gmail and Yahoo require" in dmarc.verdict
    assert dmarc.fix and "_dmarc.example.com. 3600 IN TXT" in dmarc.fix
    mx = by_name(result, "MX")
    assert mx.status == dc.PROBLEM and "no MX" in mx.verdict


def test_a_published_key_that_is_not_ours(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.remove(key.record_name)
    other = sd.public_key_b64(sd.generate_private_key("rsa"))
    dns_server.zone.txt(key.record_name, sd.dns_value("rsa", other))
    check = by_name(report(dns_server, [key]), "DKIM key")
    assert check.status == dc.PROBLEM and "different key" in check.verdict
    assert check.fix and key.zone_line in check.fix


def test_a_revoked_key_and_a_next_key_not_yet_published(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.remove(key.record_name)
    dns_server.zone.txt(key.record_name, "v=DKIM1; k=rsa; p=")
    nxt = key_record("ed25519", "ed-sd1", status="next")
    result = report(dns_server, [key, nxt])
    revoked = by_name(result, "DKIM key sd1")
    assert revoked.status == dc.PROBLEM and "revokes" in revoked.verdict
    pending = by_name(result, "DKIM key ed-sd1")
    assert pending.status == dc.WARNING and "signs nothing yet" in pending.verdict


@pytest.mark.parametrize(("spf", "status", "words"), [
    ("v=spf1 ip4:192.0.2.1 -all", dc.WARNING, "private address"),
    ("v=spf1 ip4:127.0.0.1 +all", dc.PROBLEM, "+all"),
    ("v=spf1 ip4:127.0.0.1", dc.WARNING, "does not end in -all or ~all"),
    ("v=spf1 include:_spf.relay.test ~all", dc.OK, "authorises the relay"),
    ("v=spf1 include:missing.test -all", dc.PROBLEM, "cannot be evaluated"),
    ("v=spf1 mx -all", dc.OK, "authorises the relay"),
    ("v=spf1 a:relay.test/24 -all", dc.OK, "authorises the relay"),
    ("v=spf1 redirect=_spf.relay.test", dc.OK, "authorises the relay"),
])
def test_spf_is_evaluated_for_the_relays_address(dns_server: DnsServer, spf: str,
                                                 status: str, words: str) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.remove(DOMAIN, "TXT")
    dns_server.zone.txt(DOMAIN, spf)
    dns_server.zone.txt("_spf.relay.test", "v=spf1 ip4:127.0.0.1 -all")
    dns_server.zone.add("relay.test", "A", "127.0.0.9")
    check = by_name(report(dns_server, [key]), "SPF")
    assert check.status == status, check
    assert words in check.verdict


def test_spf_for_a_public_relay_address_that_is_not_listed(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.add("smtp.relay.test", "A", "93.184.215.14")
    check = by_name(report(dns_server, [key], relay_host="smtp.relay.test"), "SPF")
    assert check.status == dc.PROBLEM and "93.184.215.14" in check.verdict


def test_spf_include_of_the_provider(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.txt("amazonses.test", "v=spf1 ip4:203.0.113.0/24 -all")
    missing = by_name(report(dns_server, [key], spf_include="amazonses.test"), "SPF")
    assert missing.status == dc.PROBLEM and "does not include amazonses.test" in missing.verdict
    assert missing.fix and "include:amazonses.test" in missing.fix
    dns_server.zone.remove(DOMAIN, "TXT")
    dns_server.zone.txt(DOMAIN, "v=spf1 include:amazonses.test -all")
    assert by_name(report(dns_server, [key], spf_include="amazonses.test"), "SPF").ok


def test_two_spf_records_and_two_dmarc_records(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.txt(DOMAIN, "v=spf1 -all")
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=none")
    result = report(dns_server, [key])
    assert "2 SPF records" in by_name(result, "SPF").verdict
    assert "2 DMARC records" in by_name(result, "DMARC").verdict


def test_dmarc_policy_and_alignment(dns_server: DnsServer) -> None:
    parent = key_record(domain=DOMAIN)
    publish_good(dns_server, parent)
    sub = "news.example.com"
    dns_server.zone.txt(sub, "v=spf1 ip4:127.0.0.1 -all")
    # The organisational domain's DMARC applies to the subdomain; p=none is monitoring.
    dns_server.zone.remove(f"_dmarc.{DOMAIN}")
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=none")
    result = report(dns_server, [parent], domain=sub, bounce_address=f"b@{sub}")
    assert "policy none (monitoring only)" in by_name(result, "DMARC").verdict
    assert by_name(result, "DKIM alignment").ok  # d=example.com aligns (relaxed)
    dns_server.zone.remove(f"_dmarc.{DOMAIN}")
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=reject; adkim=s")
    strict = by_name(report(dns_server, [parent], domain=sub, bounce_address=f"b@{sub}"),
                     "DKIM alignment")
    assert strict.status == dc.PROBLEM and "adkim=s" in strict.verdict
    assert strict.fix == f"create a key for {sub} itself: senddock dkim create {sub}"


def test_unsigned_domain_and_ed25519_only(dns_server: DnsServer) -> None:
    publish_good(dns_server, key_record())
    unsigned = by_name(report(dns_server, []), "DKIM alignment")
    assert unsigned.status == dc.PROBLEM and "unsigned" in unsigned.verdict
    assert unsigned.fix == "create a key: senddock dkim create example.com"
    ed = key_record("ed25519", "ed-sd1")
    dns_server.zone.txt(ed.record_name, ed.record_value)
    result = report(dns_server, [ed])
    assert by_name(result, "DKIM key").ok
    assert "Gmail does not verify ed25519" in by_name(result, "DKIM algorithm").verdict


def test_bounce_domain_not_aligned_and_null_mx(dns_server: DnsServer) -> None:
    key = key_record()
    publish_good(dns_server, key)
    dns_server.zone.txt("bounces.test", "v=spf1 ip4:127.0.0.1 -all")
    dns_server.zone.add("bounces.test", "MX", ".")
    result = report(dns_server, [key], bounce_address="b@bounces.test")
    alignment = by_name(result, "bounce domain alignment")
    assert alignment.status == dc.WARNING and "DKIM alone" in alignment.verdict
    mx = by_name(result, "MX of bounces.test")
    assert mx.status == dc.PROBLEM and "null MX" in mx.verdict


def test_free_mail_from_domain(dns_server: DnsServer) -> None:
    result = report(dns_server, [], domain="gmail.com", bounce_address="b@gmail.com")
    check = by_name(result, "From domain")
    assert check.status == dc.PROBLEM and "free-mail" in check.verdict


def test_a_dns_server_that_does_not_answer_is_a_problem_not_a_crash() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))  # bound, never answers
        resolver = dc.make_resolver(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
        result = dc.check_domain(resolver, DOMAIN, [], relay_host="127.0.0.1")
    assert result.status == dc.PROBLEM
    assert result.checks[-1].fix and "SENDDOCK_DNS_RESOLVER" in result.checks[-1].fix


@pytest.mark.parametrize("bad", ["dns.example.com", "1.2.3.4:x", "[::1"])
def test_bad_resolver_setting(bad: str) -> None:
    with pytest.raises(ValueError, match="SENDDOCK_DNS_RESOLVER"):
        dc.make_resolver(bad)


def receiver_dnsfunc(setting: str):  # type: ignore[no-untyped-def]
    """How a receiver finds the key: a TXT query to DNS (here, the local server)."""
    resolver = dc.make_resolver(setting)

    def dnsfunc(name: bytes, timeout: int = 5) -> bytes:
        records = dc.txt_records(resolver, name.decode().rstrip("."))
        return records[0].encode() if records else b""

    return dnsfunc


@pytest.mark.parametrize("alg", sd.ALGORITHMS)
def test_signed_mail_verifies_through_dns(dns_server: DnsServer, alg: str) -> None:
    key = key_record(alg)
    dns_server.zone.txt(key.record_name, key.record_value)
    signer = sd.SigningKey(DOMAIN, key.selector, alg, RSA if alg == "rsa" else ED)
    signed = sd.sign_message(b"From: a@example.com\r\nSubject: hi\r\n\r\nbody\r\n", [signer])
    assert dkim.verify(signed, dnsfunc=receiver_dnsfunc(dns_server.resolver_setting))
    assert dns_server.asked(key.record_name, "TXT")
    dns_server.zone.remove(key.record_name)
    assert not dkim.verify(signed, dnsfunc=receiver_dnsfunc(dns_server.resolver_setting))


def test_spf_lookup_limit_and_macros_are_permerrors(dns_server: DnsServer) -> None:
    zone = dns_server.zone
    for i in range(11):  # eleven nested includes: over RFC 7208's ten lookups
        zone.txt(f"l{i}.test", f"v=spf1 include:l{i + 1}.test -all")
    zone.txt("l11.test", "v=spf1 ip4:127.0.0.1 -all")
    zone.txt("macro.test", "v=spf1 exists:%{i}.bl.test -all")
    zone.txt("ten.test", "v=spf1 include:l2.test -all")  # l2..l11: ten lookups, allowed
    resolver = dc.make_resolver(dns_server.resolver_setting)
    assert dc.spf_evaluate(resolver, "l0.test", "127.0.0.1") == "permerror"
    assert dc.spf_evaluate(resolver, "ten.test", "127.0.0.1") == "pass"
    assert dc.spf_evaluate(resolver, "macro.test", "127.0.0.1") == "permerror"
    assert dc.spf_evaluate(resolver, "l11.test", "127.0.0.2") == "fail"
    assert dc.spf_evaluate(resolver, "nothing.test", "127.0.0.1") == "none"
