"""Real components as pytest fixtures (private Postfix, Dovecot, PostgreSQL clusters, DNS):
one module per component, exposed through :mod:`tests.real.fixtures`."""
