"""Domain functions: what SendDock does, independent of HTTP. Each takes a SQLAlchemy
``Connection`` so callers (views, the API, the CLI, tests) compose the transaction."""
