"""API: lists, subscribers, campaigns, jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import request
from werkzeug.wrappers import Response

from webapp import access
from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, config, engine, role
from webapp.domain import campaigns, lists, messages, queue_reads, tracking
from webapp.domain.errors import Invalid, NotFound
from workers.after_acceptance import feedback


def campaign_json(c: dict[str, Any]) -> dict[str, Any]:
    out = {k: c.get(k) for k in campaigns.FIELDS}
    out["from"] = out.pop("from_addr")
    out["text"] = out.pop("text_body")
    out["html"] = out.pop("html_body")
    out["counts"] = c["counts"]
    out["total"] = c["total"]
    out["audience"] = c.get("audience")
    return out


@bp.get("/lists")
def list_lists() -> Response:
    with engine().connect() as conn:
        return answer({"lists": lists.all_lists(conn)})


@bp.post("/lists")
def create_list() -> Response:
    data = body("name")
    name = data.get("name")
    if not isinstance(name, str):
        raise Invalid("name is required", fields={"name": "required string"})
    with engine().begin() as conn:
        row = lists.create_list(conn, name, actor=actor())
    return answer({"id": row["id"], "name": row["name"]}, 201)


@bp.post("/lists/<int:list_id>/subscribers")
def add_subscribers(list_id: int) -> Response:
    items = body("subscribers").get("subscribers")
    if not isinstance(items, list):
        raise Invalid("subscribers must be a list", fields={"subscribers": "required list"})
    if len(items) > 10_000:
        raise Invalid("at most 10,000 subscribers per request; use CSV import for more",
                      fields={"subscribers": "too many"})
    with engine().begin() as conn:
        return answer(lists.add_subscribers(conn, list_id, items))


CAMPAIGN_FIELDS = ("name", "list_id", "subject", "text", "html", "from", "segment_id",
                   "layout_id", *tracking.SETTINGS)


@bp.post("/campaigns")
def create_campaign() -> Response:
    data = body(*CAMPAIGN_FIELDS)
    with engine().begin() as conn:
        campaign = campaigns.create(conn, data, default_from=config().mail_from,
                                    actor=actor())
        tracking.save_settings(conn, campaign["id"], data, actor=actor())
    return answer(campaign_json(campaign), 201)


@bp.get("/campaigns/<int:campaign_id>")
def get_campaign(campaign_id: int) -> Response:
    with engine().connect() as conn:
        return answer(campaign_json(campaigns.with_counts(conn, campaign_id)))


ACTIONS = {"send": campaigns.send, "pause": campaigns.pause, "resume": campaigns.resume,
           "cancel": campaigns.cancel}


@bp.post("/campaigns/<int:campaign_id>/<any(send, pause, resume, cancel):action>")
def campaign_action(campaign_id: int, action: str) -> Response:
    kwargs: dict[str, Any] = {"actor": actor()}
    if action == "send" and request.data:
        at = body("at").get("at")
        if at is not None:
            try:
                kwargs["at"] = datetime.fromisoformat(str(at))
            except ValueError:
                raise Invalid("at must be an ISO 8601 time with a zone",
                              fields={"at": "invalid time"}) from None
            if kwargs["at"].tzinfo is None:
                raise Invalid("at must include a time zone (e.g. 2026-12-01T09:00:00Z)",
                              fields={"at": "missing time zone"})
    with engine().begin() as conn:
        campaign = ACTIONS[action](conn, campaign_id, **kwargs)
    return answer(campaign_json(campaign), 202)


# What a marketer may not see of a campaign job: the payload (a verification's payload
# holds a working verify link, a test send's the tester's choices) and who asked for it.
MARKETER_HIDDEN = ("payload", "user_ref", "idempotency_key", "requested_by")


@bp.get("/jobs/<int:job_id>")
def get_job(job_id: int) -> Response:
    """Support and admins read any job. A marketer reads only jobs of a campaign, without
    their payload; any other job answers 404 as if it did not exist (ids are sequential,
    so a 403 would tell which verification ids exist)."""
    marketer = role() not in access.JOB_READERS
    with engine().connect() as conn:
        job = queue_reads.get_job(conn, job_id)
        if job is None or (marketer and job.get("campaign_id") is None):
            raise NotFound(f"job {job_id} does not exist")
        job.pop("claim_token", None)
        if marketer:
            for key in MARKETER_HIDDEN:
                job.pop(key, None)
        else:
            view = messages.as_json(job) if job["kind"] != "broadcast" else {}
            job["event"], job["data"] = view.get("event"), view.get("data")
        job["attempts_made"] = job.pop("attempts")
        job["attempts"] = queue_reads.job_attempts(conn, job_id)
        # Bounces and complaints after acceptance (docs/design.md §18), without their raw source.
        job["events"] = [{k: v for k, v in e.items() if k not in ("raw", "raw_truncated")}
                         for e in feedback.events_for_jobs(conn, [job_id])[job_id]]
    return answer(job)


@bp.get("/openapi.json")
def openapi() -> Response:
    from webapp.openapi import document

    return answer(document())
