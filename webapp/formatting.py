"""Helpers every template may use to show numbers honestly (registered in ``create_app``)."""

from __future__ import annotations

from flask import Flask

from webapp.domain.progress import percent_done


def init_app(app: Flask) -> None:
    app.jinja_env.globals["percent_done"] = percent_done
