"""Real components that the tests and the benches both start privately: PostgreSQL
clusters (pgcluster), Postfix (postfix), Dovecot (dovecot), a DNS server (dns), OpenDKIM
(opendkim), and seed data (seed). Tests get them as fixtures (tests/real/fixtures.py);
benches use them directly. Never shipped in the wheel; tests and bench never import each
other, both import from here."""
