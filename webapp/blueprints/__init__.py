"""One blueprint per area; templates mirror them under ``templates/<area>/``."""

from __future__ import annotations

from flask import Flask


def register_all(app: Flask) -> None:
    from webapp.blueprints import account, api, auth, home

    app.register_blueprint(auth.bp)
    app.register_blueprint(account.bp)
    app.register_blueprint(home.bp)
    app.register_blueprint(api.bp, url_prefix="/api/v1")
    from webapp.blueprints import campaigns, lists, public

    app.register_blueprint(campaigns.bp)
    app.register_blueprint(lists.bp)
    app.register_blueprint(public.bp)
    from webapp.blueprints import support

    app.register_blueprint(support.bp)
    from webapp.blueprints import admin, health, inbox, jobs, ops, transactional

    app.register_blueprint(admin.bp)
    app.register_blueprint(inbox.bp)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(ops.bp)
    app.register_blueprint(transactional.bp)
    from webapp.blueprints import event_webhooks, webhooks

    app.register_blueprint(webhooks.bp)
    app.register_blueprint(event_webhooks.bp)
    from webapp.blueprints import domains

    app.register_blueprint(domains.bp)
    from webapp.blueprints import layouts, segments

    app.register_blueprint(segments.bp)
    app.register_blueprint(layouts.bp)
    from webapp.blueprints import tracking

    app.register_blueprint(tracking.bp)
    from webapp.blueprints import sequences

    app.register_blueprint(sequences.bp)
    extra = app.extensions["senddock"].config.extra
    if extra.get("process") == "demo" and extra.get("demo_mail_dir"):
        # `senddock demo` only: the mail viewer of its SMTP sink.
        from webapp.blueprints import demo_mail

        app.register_blueprint(demo_mail.bp)
