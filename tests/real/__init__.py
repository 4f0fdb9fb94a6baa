"""The real components of :mod:`harness` (PostgreSQL clusters, Postfix, Dovecot, DNS)
exposed to the tests as fixtures by :mod:`tests.real.fixtures`."""
