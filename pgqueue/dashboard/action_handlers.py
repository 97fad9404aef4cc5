"""The POST handlers behind the dashboard's buttons: one job, the selected
jobs or a filter, a dead-letter group, a queue, a schedule.

Each returns what it did (``target`` and ``count`` for the log, ``message``
for the page, the fields of the JSON answer, ``progress`` of a bulk run);
:meth:`~pgqueue.dashboard.endpoints.Dashboard.action` checks who may act
before a handler runs and answers after it.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request

from pgqueue.dashboard import actions
from pgqueue.dashboard.data import JobFilter, parse_group_key
from pgqueue.dashboard.endpoints import Dashboard
from pgqueue.dashboard.forms import int_list, job_id_of, text, total
from pgqueue.dashboard.views import describe
from pgqueue.errors import InvalidOption

Outcome = dict[str, Any]


async def job_cancel(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    job_id = job_id_of(request)
    status = await dash.app.cancel_async(job_id)
    return {
        "target": f"job {job_id}",
        "count": 1,
        "job_id": job_id,
        "status": status,
        "message": f"job {job_id}: {status}",
    }


async def job_replay(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    job_id = job_id_of(request)
    new_id = await dash.app.replay_async(job_id)
    return {
        "target": f"job {job_id}",
        "count": 1,
        "job_id": new_id,
        "replayed_from": job_id,
        "message": f"job {job_id} replayed as job {new_id}",
    }


async def job_requeue(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    job_id = job_id_of(request)
    await dash.app.requeue_dead_async(job_id)
    return {
        "target": f"job {job_id}",
        "count": 1,
        "job_id": job_id,
        "message": f"job {job_id} requeued",
    }


async def bulk(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    """Cancel, replay or requeue the selected jobs, or (in bounded batches,
    one per request) everything a filter matches."""
    action = str(form.get("action") or "")
    if action not in actions.ACTIONS:
        raise InvalidOption(f"unknown action {action!r}: one of {', '.join(actions.ACTIONS)}")
    ids = int_list(form, "job_id")
    if ids:
        acted, skipped = await actions.act_on_ids(dash.app, action, ids)
        return {
            "target": f"{len(ids)} selected jobs",
            "count": acted,
            "skipped": skipped,
            "message": f"{action}: {acted} of {len(ids)} selected jobs"
            + (f" ({skipped} not applicable)" if skipped else ""),
        }
    if form.get("scope") != "filter":
        raise InvalidOption("select jobs, or choose to act on everything the filter matches")
    flt = JobFilter.parse(form)
    progress = await actions.act_on_filter(
        dash.data, action, flt, text(form.get("cursor")), total(form)
    )
    return {
        "target": f"filter {flt.params()}",
        "count": progress.processed,
        "progress": progress,
        "message": f"{action} on jobs matching {describe(flt)}",
    }


async def requeue_group(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    """Requeue the dead jobs of one group of the dead-letter page."""
    group = parse_group_key(str(form.get("group") or ""))
    progress = await actions.requeue_group(dash.data, group, text(form.get("cursor")), total(form))
    task, code, _ = group
    return {
        "target": f"dead group {task} / {code}",
        "count": progress.processed,
        "progress": progress,
        "message": f"requeue dead {task} jobs failing with {code}",
    }


async def queue_pause(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    return await _set_paused(dash, request.path_params["queue"], True)


async def queue_resume(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    return await _set_paused(dash, request.path_params["queue"], False)


async def _set_paused(dash: Dashboard, name: str, paused: bool) -> Outcome:
    if paused:
        await dash.app.pause_queue_async(name)
    else:
        await dash.app.resume_queue_async(name)
    return {
        "target": f"queue {name}",
        "count": 1,
        "queue": name,
        "paused": paused,
        "message": f"queue {name} {'paused' if paused else 'resumed'}",
    }


async def queue_limits(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    name = request.path_params["queue"]
    raw = text(form.get("concurrency"))
    concurrency = None
    if raw:
        try:
            concurrency = int(raw)
        except ValueError:
            raise InvalidOption(f"concurrency must be a whole number, got {raw!r}") from None
    rate = text(form.get("rate"))
    await dash.app.set_queue_limit_async(name, concurrency=concurrency, rate=rate)
    return {
        "target": f"queue {name}",
        "count": 1,
        "queue": name,
        "concurrency_limit": concurrency,
        "rate_limit": rate,
        "message": f"queue {name}: concurrency {concurrency or 'unlimited'}, "
        f"rate {rate or 'unlimited'}",
    }


async def schedule_enable(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    item = await dash.app.enable_schedule_async(request.path_params["name"])
    return {
        "target": f"schedule {item.name}",
        "count": 1,
        "schedule": item,
        "message": f"schedule {item.name} enabled",
    }


async def schedule_disable(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    item = await dash.app.disable_schedule_async(request.path_params["name"])
    return {
        "target": f"schedule {item.name}",
        "count": 1,
        "schedule": item,
        "message": f"schedule {item.name} disabled",
    }


async def schedule_run(dash: Dashboard, request: Request, form: FormData) -> Outcome:
    name = request.path_params["name"]
    enqueued = await dash.app.run_schedule_now_async(name)
    return {
        "target": f"schedule {name}",
        "count": 1,
        "job_id": enqueued.job_id,
        "created": enqueued.created,
        "message": f"schedule {name} ran now: job {enqueued.job_id}",
    }
