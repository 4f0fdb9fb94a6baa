"""``python -m webapp.access_docs``: rewrite the role matrix and the token scopes table in
docs/security.md from the routes the app registers and :mod:`webapp.access`, and its stored
text limits from :mod:`webapp.domain.text_limits` (no database needed)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from webapp import access, create_app
from webapp.domain import text_limits
from workers.core.settings import load


def main() -> None:
    app = create_app(load({"SECRET_KEY": "docs", "DATABASE_URL": "postgresql://docs@/docs"}),
                     engine=sa.create_engine("postgresql+psycopg://docs@/docs"))
    path = Path(__file__).resolve().parent.parent / "docs" / "security.md"
    table = access.markdown_table(app.url_map.iter_rules())
    text = access.rewrite_docs(path.read_text(encoding="utf-8"), table)
    text = access.rewrite_scopes_docs(text, access.scopes_table())
    path.write_text(text_limits.rewrite_docs(text), encoding="utf-8")


if __name__ == "__main__":
    main()
