"""Real components the tests start privately (PostgreSQL clusters, Postfix, Dovecot, DNS):
one module per component, exposed as fixtures by :mod:`tests.real.fixtures`."""
