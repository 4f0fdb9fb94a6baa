"""What both sides of the engine use: the database connection and its outages (pg), the
settings (settings), the translation marker (i18n) and the job vocabulary (states)."""
