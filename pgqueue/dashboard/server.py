"""The ASGI application: routes, pages, the JSON API and actions.

Pages are rendered on the server (Jinja2, autoescaped: payloads, errors, task
and queue names are attacker-controlled text); htmx (vendored under
``static/``) swaps the live regions and drives bulk-action progress. The
Content-Security-Policy allows scripts and styles from this origin only.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import structlog
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import pgqueue
from pgqueue.dashboard import actions
from pgqueue.dashboard.auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    SESSION_COOKIE,
    Authorize,
    Guard,
    Identity,
)
from pgqueue.dashboard.data import (
    COUNT_CAP,
    DEAD_GROUP_SAMPLE,
    SEARCH_WINDOW,
    TASK_STATS_SAMPLE,
    TASK_STATS_WINDOW,
    THROUGHPUT_PER_MINUTE,
    Data,
    JobFilter,
    parse_group_key,
    visible_statuses,
)
from pgqueue.dashboard.live import LiveHub
from pgqueue.errors import (
    DatabaseError,
    InvalidInput,
    InvalidOption,
    JobNotFound,
    PgQueueError,
    ScheduleNotFound,
)
from pgqueue.explain import fmt_span

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.dashboard")

HERE = Path(__file__).parent
TOKEN_ENV = "PGQUEUE_DASHBOARD_TOKEN"
LOGIN_FAILURE_DELAY = 0.5

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; "
    "object-src 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

NAV = (
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/dead", "Dead letters"),
    ("/queues", "Queues"),
    ("/schedules", "Schedules"),
    ("/workers", "Workers"),
    ("/tasks", "Tasks"),
)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return fmt_span(max(0.0, float(seconds)))


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _secs(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    # A wait can come out below zero only from rows written by hand (a job
    # started before its run_at): show it as none.
    value = max(0.0, float(value))
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return fmt_span(value)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=_age, when=_when, pretty=_pretty, percent=_percent, secs=_secs)
    return env


def _jsonable(value: Any) -> Any:
    # The CLI's serialiser, so that /api/ answers exactly like --json.
    from pgqueue_cli.output import to_jsonable

    return to_jsonable(value)


class Dashboard:
    """Request handlers over one App."""

    def __init__(self, app: App, guard: Guard, cache_ttl: float = 1.0) -> None:
        self.app = app
        self.guard = guard
        self.data = Data(app, ttl=cache_ttl)
        self.live = LiveHub(app, on_change=self.data.invalidate)
        self.env = _environment()

    # --- plumbing ------------------------------------------------------------

    @staticmethod
    def url(request: Request, path: str, **params: Any) -> str:
        root = _root(request)
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return root + path + ("?" + urlencode(query) if query else "")

    @staticmethod
    def wants_json(request: Request) -> bool:
        return request.url.path.startswith(
            _root(request) + "/api/"
        ) or "application/json" in request.headers.get("accept", "")

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        identity: Identity = request.state.identity
        csrf, new_cookie = self.guard.csrf_token(request)
        page = self.env.get_template(template).render(
            request=request,
            url=lambda path, **params: self.url(request, path, **params),
            nav=NAV,
            path=request.url.path[len(_root(request)) :] or "/",
            read_only=self.guard.read_only,
            token_configured=self.guard.login_required,
            identity=identity,
            csrf_field=CSRF_FIELD,
            csrf_token=csrf,
            flash=self._flash(request),
            version=pgqueue.__version__,
            **context,
        )
        response = HTMLResponse(page, status_code=status_code)
        if new_cookie:
            response.set_cookie(
                CSRF_COOKIE,
                new_cookie,
                httponly=True,
                samesite="strict",
                path=self._cookie_path(request),
                secure=request.url.scheme == "https",
            )
        return response

    def _flash(self, request: Request) -> str | None:
        """The message of the last action, only when this dashboard wrote it
        (a crafted link cannot put words on the page)."""
        message = request.query_params.get("flash")
        signature = request.query_params.get("sig", "")
        if message and self.guard.flash_ok(message, signature):
            return message
        return None

    @staticmethod
    def _cookie_path(request: Request) -> str:
        return _root(request) + "/"

    def error(self, request: Request, status: int, message: str) -> Response:
        if self.wants_json(request) or not hasattr(request.state, "identity"):
            return JSONResponse({"error": message}, status_code=status)
        return self.render(request, "error.html", status_code=status, message=message)

    def unauthorized(self, request: Request, message: str) -> Response:
        if self.wants_json(request) or request.headers.get("authorization"):
            return JSONResponse(
                {"error": message}, status_code=401, headers={"www-authenticate": "Bearer"}
            )
        request.state.identity = Identity(None, "")
        return self.render(
            request,
            "login.html",
            status_code=401,
            message=message,
            next=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        )

    def _authenticate(self, request: Request) -> Response | None:
        identity = self.guard.identify(request)
        request.state.identity = identity
        if self.guard.login_required and identity.method is None:
            if request.headers.get("authorization"):
                return self.unauthorized(request, "wrong token")
            return self.unauthorized(request, "log in with the dashboard token")
        return None

    def page(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Authenticate, run, turn pgqueue's errors into 400/404."""

        async def endpoint(request: Request) -> Response:
            refused = self._authenticate(request)
            if refused is not None:
                return refused
            try:
                response = await handler(request)
            except (JobNotFound, ScheduleNotFound) as exc:
                response = self.error(request, 404, str(exc))
            except InvalidInput as exc:
                response = self.error(request, 400, str(exc))
            except PgQueueError as exc:
                response = self.error(request, 503, str(exc))
            response.headers.update(SECURITY_HEADERS)
            return response

        return endpoint

    def action(
        self, name: str, handler: Callable[[Request, FormData], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST action: 401 without identity, 403 when read-only, without a
        valid CSRF token or refused by ``authorize``; then run and log it."""

        async def endpoint(request: Request) -> Response:
            refused = self._authenticate(request)
            if refused is not None:
                log.warning(
                    "dashboard action refused",
                    who=request.state.identity.who,
                    action=name,
                    path=request.url.path,
                    reason="not authenticated",
                )
                return refused
            identity: Identity = request.state.identity

            def refuse(reason: str) -> Response:
                log.warning(
                    "dashboard action refused",
                    who=identity.who,
                    action=name,
                    path=request.url.path,
                    reason=reason,
                )
                return self.error(request, 403, reason)

            if self.guard.read_only:
                return refuse(
                    f"read-only dashboard: {name} refused (set {TOKEN_ENV} to allow actions)"
                )
            form = await request.form()
            if identity.method != "bearer":
                submitted = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
                if not isinstance(submitted, str) or not self.guard.csrf_ok(request, submitted):
                    return refuse("missing or invalid CSRF token")
                origin = request.headers.get("origin")
                if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
                    return refuse(f"cross-origin request from {origin}")
            if not await self.guard.allowed(request, name):
                return refuse(f"not allowed: {name}")
            try:
                outcome = await handler(request, form)
            except (JobNotFound, ScheduleNotFound) as exc:
                return self.error(request, 404, str(exc))
            except InvalidInput as exc:
                return self.error(request, 400, str(exc))
            except DatabaseError as exc:  # unreachable, timed out, read-only: try again later
                return self.error(request, 503, str(exc))
            except PgQueueError as exc:  # e.g. cancelling a finished job
                return self.error(request, 409, str(exc))
            finally:
                self.data.invalidate()  # what the action changed shows on the next page
            log.info(
                "dashboard action",
                who=identity.who,
                action=name,
                target=outcome.get("target"),
                count=outcome.get("count"),
            )
            return self._action_response(request, form, outcome)

        return endpoint

    def _action_response(
        self, request: Request, form: FormData, outcome: dict[str, Any]
    ) -> Response:
        progress = outcome.get("progress")
        if self.wants_json(request) or request.state.identity.method == "bearer":
            body = {k: v for k, v in outcome.items() if k != "progress"}
            if progress is not None:
                body.update(progress.as_json())
            return JSONResponse(_jsonable(body))
        response: Response
        if progress is not None:
            response = self.render(
                request,
                "progress.html",
                progress=progress,
                message=outcome["message"],
                form={
                    k: v for k, v in form.multi_items() if k not in (CSRF_FIELD, "cursor", "total")
                },
                action_url=request.url.path,
                back=_safe_next(request, form),
            )
        else:
            target = _without_flash(_safe_next(request, form))
            sep = "&" if "?" in target else "?"
            response = RedirectResponse(
                target
                + sep
                + urlencode(
                    {"flash": outcome["message"], "sig": self.guard.sign_flash(outcome["message"])}
                ),
                status_code=303,
            )
        response.headers.update(SECURITY_HEADERS)
        return response


def _without_flash(target: str) -> str:
    """``target`` without the message of an earlier action."""
    path, _, query = target.partition("?")
    kept = [
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in ("flash", "sig")
    ]
    return path + ("?" + urlencode(kept) if kept else "")


def _root(request: Request) -> str:
    """The mount prefix of this dashboard ("" at the root)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _safe_next(request: Request, form: FormData) -> str:
    """Where to go after an action: a same-site path only (no open redirect)."""
    root = _root(request)
    value = form.get("next")
    if (
        isinstance(value, str)
        and value.startswith("/")
        and not value.startswith("//")
        and ("\\" not in value)
    ):
        return value if value.startswith(root + "/") else root + value
    return root + "/"


def _int_list(form: FormData, name: str) -> list[int]:
    out = []
    for value in form.getlist(name):
        try:
            number = int(str(value))
        except ValueError:
            raise InvalidOption(f"{name} must be job ids, got {value!r}") from None
        if number < 1:
            raise InvalidOption(f"{name} must be positive job ids, got {number}")
        out.append(number)
    if len(out) > 1000:
        raise InvalidOption("select at most 1000 jobs at once; act on a filter for more")
    return out


def _job_id(request: Request) -> int:
    value = request.path_params["job_id"]
    if value < 1:
        raise InvalidOption(f"job id must be a positive integer, got {value}")
    return int(value)


def create_app(
    app: App,
    *,
    read_only: bool = False,
    authorize: Authorize | None = None,
    token: str | None = None,
    cache_ttl: float = 1.0,
) -> Starlette:
    """The dashboard as an ASGI app, to serve with uvicorn or mount in a host
    (Starlette/FastAPI ``app.mount("/pgqueue", create_app(queue_app))``).

    ``token`` (default: ``PGQUEUE_DASHBOARD_TOKEN``) protects every page and
    allows actions; without one, and without ``authorize``, the dashboard is
    read-only. ``authorize(request, action) -> bool`` (sync or async) lets a
    host decide each action after authenticating the user itself.
    ``cache_ttl``: seconds that browsers share the reads of a page (0: off).
    """
    guard = Guard(
        token if token is not None else os.environ.get(TOKEN_ENV),
        read_only=read_only,
        authorize=authorize,
    )
    if cache_ttl < 0:
        raise InvalidOption(f"cache_ttl must be 0 or more seconds, got {cache_ttl!r}")
    dash = Dashboard(app, guard, cache_ttl)
    d = dash.data

    # --- pages -----------------------------------------------------------------

    async def overview(request: Request) -> Response:
        queues, chart = await asyncio.gather(d.queues(), d.throughput())
        if dash.wants_json(request):
            return JSONResponse(
                {
                    "queues": [q.as_json() for q in queues],
                    "throughput": [
                        {
                            "minute": datetime.fromtimestamp(m, UTC).isoformat(),
                            "succeeded": s,
                            "dead": f,
                            "estimated": e,
                        }
                        for m, s, f, e in chart
                    ],
                }
            )
        return dash.render(
            request,
            "overview.html",
            queues=queues,
            chart=_chart(chart),
            cap=COUNT_CAP,
            per_minute=THROUGHPUT_PER_MINUTE,
        )

    async def jobs(request: Request) -> Response:
        flt = JobFilter.parse(request.query_params)
        cursor = request.query_params.get("cursor") or None
        page = await d.jobs(flt, cursor)
        if dash.wants_json(request):
            return JSONResponse(_jsonable({"jobs": page.jobs, "next_cursor": page.next_cursor}))
        queue_names = await d.queue_names()
        return dash.render(
            request,
            "jobs.html",
            page=page,
            filter=flt,
            statuses=visible_statuses(),
            queue_names=queue_names,
            window=SEARCH_WINDOW,
            cursor=cursor,
            searching=flt.q is not None or flt.status is None,
        )

    async def job(request: Request) -> Response:
        job_id = _job_id(request)
        record, explanation = await d.job(job_id)
        if dash.wants_json(request):
            return JSONResponse(_jsonable(record))
        timeline = _timeline(record)
        return dash.render(
            request,
            "job.html",
            job=record,
            explanation=explanation,
            timeline=timeline,
            payload_text=_pretty(record.payload),
            result_text=_pretty(record.result),
        )

    async def dead(request: Request) -> Response:
        groups, capped = await d.dead_groups()
        if dash.wants_json(request):
            return JSONResponse(
                _jsonable(
                    {
                        "groups": [{**_jsonable(g), "key": g.key} for g in groups],
                        "sampled": DEAD_GROUP_SAMPLE if capped else None,
                    }
                )
            )
        return dash.render(
            request, "dead.html", groups=groups, capped=capped, sample=DEAD_GROUP_SAMPLE
        )

    async def queues_page(request: Request) -> Response:
        # The page shows live counts only; the API answers like `pgqueue status --json`.
        queues = await d.queues(finished=dash.wants_json(request))
        if dash.wants_json(request):
            return JSONResponse([q.as_json() for q in queues])
        return dash.render(request, "queues.html", queues=queues)

    async def schedules(request: Request) -> Response:
        items = await app.list_schedules_async()
        if dash.wants_json(request):
            return JSONResponse(_jsonable(items))
        return dash.render(request, "schedules.html", schedules=items)

    async def workers(request: Request) -> Response:
        rows = await d.workers()
        if dash.wants_json(request):
            return JSONResponse(_jsonable(rows))
        return dash.render(request, "workers.html", workers=rows)

    async def tasks(request: Request) -> Response:
        overview = await d.tasks()
        if dash.wants_json(request):
            return JSONResponse(_jsonable(overview.as_json()))
        return dash.render(
            request,
            "tasks.html",
            tasks=overview.rows,
            window_start=overview.window_start,
            sampled=overview.sampled,
            sample=TASK_STATS_SAMPLE,
            window=TASK_STATS_WINDOW,
        )

    async def metrics(request: Request) -> Response:
        # The database view of `pgqueue metrics` (capped counts, estimates beyond).
        return PlainTextResponse(
            await app.metrics_text_async(), media_type="text/plain; version=0.0.4"
        )

    async def login_form(request: Request) -> Response:
        request.state.identity = guard.identify(request)
        if not guard.login_required:
            return RedirectResponse(dash.url(request, "/"), status_code=303)
        response = dash.render(
            request, "login.html", message=None, next=request.query_params.get("next", "/")
        )
        response.headers.update(SECURITY_HEADERS)
        return response

    async def login(request: Request) -> Response:
        request.state.identity = Identity(None, request.client.host if request.client else "")
        form = await request.form()
        submitted = form.get(CSRF_FIELD)
        if not isinstance(submitted, str) or not guard.csrf_ok(request, submitted):
            return dash.error(request, 403, "missing or invalid CSRF token: reload the login page")
        given = form.get("token")
        if not guard.login_required or not isinstance(given, str) or not guard.check_token(given):
            log.warning("dashboard login refused", who=request.state.identity.who)
            await asyncio.sleep(LOGIN_FAILURE_DELAY)  # slows down guessing
            response = dash.render(
                request,
                "login.html",
                status_code=401,
                message="wrong token",
                next=form.get("next") or "/",
            )
            response.headers.update(SECURITY_HEADERS)
            return response
        log.info("dashboard login", who=f"cookie@{request.state.identity.client}")
        redirect = RedirectResponse(_safe_next(request, form), status_code=303)
        redirect.set_cookie(
            SESSION_COOKIE,
            guard.session_value(),
            httponly=True,
            samesite="strict",
            path=dash._cookie_path(request),
            secure=request.url.scheme == "https",
        )
        return redirect

    async def logout(request: Request) -> Response:
        form = await request.form()
        submitted = form.get(CSRF_FIELD)
        if not isinstance(submitted, str) or not guard.csrf_ok(request, submitted):
            return JSONResponse({"error": "missing or invalid CSRF token"}, status_code=403)
        response = RedirectResponse(dash.url(request, "/login"), status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=dash._cookie_path(request))
        return response

    async def healthz(request: Request) -> Response:
        try:
            report = await app.check_async()
        except PgQueueError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
        # The dashboard is healthy when it reaches a migrated schema; queue
        # backlogs and stuck jobs are shown on its pages, not a reason to restart it.
        ok = report.server_version is not None and (
            report.schema_revision == report.expected_revision
        )
        return JSONResponse(
            {
                "ok": ok,
                "schema_revision": report.schema_revision,
                "queues_ok": report.ok,
            },
            status_code=200 if ok else 503,
        )

    async def events(request: Request) -> Response:
        queue = dash.live.subscribe()

        async def stream() -> Any:
            try:
                yield "retry: 3000\n\n"
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=15.0)
                        yield f"event: {event}\ndata: {int(time.time())}\n\n"
                    except TimeoutError:
                        yield ": keep-alive\n\n"
            finally:
                dash.live.unsubscribe(queue)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    # --- actions ---------------------------------------------------------------

    async def job_cancel(request: Request, form: FormData) -> dict[str, Any]:
        job_id = _job_id(request)
        status = await app.cancel_async(job_id)
        return {
            "target": f"job {job_id}",
            "count": 1,
            "job_id": job_id,
            "status": status,
            "message": f"job {job_id}: {status}",
        }

    async def job_replay(request: Request, form: FormData) -> dict[str, Any]:
        job_id = _job_id(request)
        new_id = await app.replay_async(job_id)
        return {
            "target": f"job {job_id}",
            "count": 1,
            "job_id": new_id,
            "replayed_from": job_id,
            "message": f"job {job_id} replayed as job {new_id}",
        }

    async def job_requeue(request: Request, form: FormData) -> dict[str, Any]:
        job_id = _job_id(request)
        await app.requeue_dead_async(job_id)
        return {
            "target": f"job {job_id}",
            "count": 1,
            "job_id": job_id,
            "message": f"job {job_id} requeued",
        }

    async def bulk(request: Request, form: FormData) -> dict[str, Any]:
        action = str(form.get("action") or "")
        if action not in actions.ACTIONS:
            raise InvalidOption(f"unknown action {action!r}: one of {', '.join(actions.ACTIONS)}")
        ids = _int_list(form, "job_id")
        if ids:
            acted, skipped = await actions.act_on_ids(app, action, ids)
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
            app, action, flt, _str(form.get("cursor")), _total(form)
        )
        return {
            "target": f"filter {flt.params()}",
            "count": progress.processed,
            "progress": progress,
            "message": f"{action} on jobs matching {_describe(flt)}",
        }

    async def requeue_group(request: Request, form: FormData) -> dict[str, Any]:
        group = parse_group_key(str(form.get("group") or ""))
        progress = await actions.requeue_group(app, group, _str(form.get("cursor")), _total(form))
        task, code, _ = group
        return {
            "target": f"dead group {task} / {code}",
            "count": progress.processed,
            "progress": progress,
            "message": f"requeue dead {task} jobs failing with {code}",
        }

    async def queue_pause(request: Request, form: FormData) -> dict[str, Any]:
        name = request.path_params["queue"]
        await app.pause_queue_async(name)
        return {
            "target": f"queue {name}",
            "count": 1,
            "queue": name,
            "paused": True,
            "message": f"queue {name} paused",
        }

    async def queue_resume(request: Request, form: FormData) -> dict[str, Any]:
        name = request.path_params["queue"]
        await app.resume_queue_async(name)
        return {
            "target": f"queue {name}",
            "count": 1,
            "queue": name,
            "paused": False,
            "message": f"queue {name} resumed",
        }

    async def queue_limits(request: Request, form: FormData) -> dict[str, Any]:
        name = request.path_params["queue"]
        raw = _str(form.get("concurrency"))
        concurrency = None
        if raw:
            try:
                concurrency = int(raw)
            except ValueError:
                raise InvalidOption(f"concurrency must be a whole number, got {raw!r}") from None
        rate = _str(form.get("rate"))
        await app.set_queue_limit_async(name, concurrency=concurrency, rate=rate)
        return {
            "target": f"queue {name}",
            "count": 1,
            "queue": name,
            "concurrency_limit": concurrency,
            "rate_limit": rate,
            "message": f"queue {name}: concurrency {concurrency or 'unlimited'}, "
            f"rate {rate or 'unlimited'}",
        }

    async def schedule_enable(request: Request, form: FormData) -> dict[str, Any]:
        item = await app.enable_schedule_async(request.path_params["name"])
        return {
            "target": f"schedule {item.name}",
            "count": 1,
            "schedule": item,
            "message": f"schedule {item.name} enabled",
        }

    async def schedule_disable(request: Request, form: FormData) -> dict[str, Any]:
        item = await app.disable_schedule_async(request.path_params["name"])
        return {
            "target": f"schedule {item.name}",
            "count": 1,
            "schedule": item,
            "message": f"schedule {item.name} disabled",
        }

    async def schedule_run(request: Request, form: FormData) -> dict[str, Any]:
        name = request.path_params["name"]
        enqueued = await app.run_schedule_now_async(name)
        return {
            "target": f"schedule {name}",
            "count": 1,
            "job_id": enqueued.job_id,
            "created": enqueued.created,
            "message": f"schedule {name} ran now: job {enqueued.job_id}",
        }

    p, a = dash.page, dash.action
    routes = [
        Route("/", p(overview)),
        Route("/jobs", p(jobs)),
        Route("/jobs/{job_id:int}", p(job)),
        Route("/dead", p(dead)),
        Route("/queues", p(queues_page)),
        Route("/schedules", p(schedules)),
        Route("/workers", p(workers)),
        Route("/tasks", p(tasks)),
        Route("/metrics", p(metrics)),
        Route("/events", p(events)),
        Route("/healthz", healthz),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/overview", p(overview)),
        Route("/api/jobs", p(jobs)),
        Route("/api/jobs/{job_id:int}", p(job)),
        Route("/api/dead", p(dead)),
        Route("/api/queues", p(queues_page)),
        Route("/api/schedules", p(schedules)),
        Route("/api/workers", p(workers)),
        Route("/api/tasks", p(tasks)),
        Route("/actions/jobs/{job_id:int}/cancel", a("cancel", job_cancel), methods=["POST"]),
        Route("/actions/jobs/{job_id:int}/replay", a("replay", job_replay), methods=["POST"]),
        Route("/actions/jobs/{job_id:int}/requeue", a("requeue", job_requeue), methods=["POST"]),
        Route("/actions/jobs", a("bulk", bulk), methods=["POST"]),
        Route("/actions/dead/requeue", a("requeue_group", requeue_group), methods=["POST"]),
        Route("/actions/queues/{queue:path}/pause", a("pause", queue_pause), methods=["POST"]),
        Route("/actions/queues/{queue:path}/resume", a("resume", queue_resume), methods=["POST"]),
        Route("/actions/queues/{queue:path}/limits", a("limits", queue_limits), methods=["POST"]),
        Route(
            "/actions/schedules/{name:path}/enable",
            a("schedule_enable", schedule_enable),
            methods=["POST"],
        ),
        Route(
            "/actions/schedules/{name:path}/disable",
            a("schedule_disable", schedule_disable),
            methods=["POST"],
        ),
        Route(
            "/actions/schedules/{name:path}/run", a("schedule_run", schedule_run), methods=["POST"]
        ),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    starlette = Starlette(routes=routes)
    starlette.state.dashboard = dash
    return starlette


def _str(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _total(form: FormData) -> int:
    try:
        return max(0, int(str(form.get("total") or 0)))
    except ValueError:
        return 0


def _describe(flt: JobFilter) -> str:
    parts = [f"{k}={v}" for k, v in flt.params().items()]
    return ", ".join(parts) or "no filter (every job)"


def _chart(points: list[tuple[int, int, int, bool]]) -> dict[str, Any]:
    """Bars of an inline SVG: one per minute, succeeded stacked under dead;
    estimated minutes (busier than the per-minute count) are marked."""
    peak = max((s + f for _, s, f, _ in points), default=0) or 1
    width, height, bar = 600, 120, 10
    bars = []
    for i, (minute, ok, failed, estimated) in enumerate(points):
        h_ok = round(height * ok / peak)
        h_dead = round(height * failed / peak)
        approx = "≈" if estimated else ""
        bars.append(
            {
                "x": i * bar,
                "ok_y": height - h_ok,
                "ok_h": h_ok,
                "dead_y": height - h_ok - h_dead,
                "dead_h": h_dead,
                "label": f"{datetime.fromtimestamp(minute, UTC):%H:%M}: "
                f"{approx}{ok} succeeded, {approx}{failed} dead",
            }
        )
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "bar": bar - 2,
        "peak": peak,
        "estimated": any(e for *_, e in points),
        "total_ok": sum(s for _, s, _, _ in points),
        "total_dead": sum(f for _, _, f, _ in points),
    }


def _timeline(job: pgqueue.Job) -> list[tuple[datetime, str]]:
    events: list[tuple[datetime, str]] = [(job.created_at, "created")]
    if job.run_at != job.created_at:
        events.append((job.run_at, "due (run_at)"))
    for attempt in job.attempt_history or []:
        events.append(
            (
                attempt.started_at,
                f"attempt {attempt.attempt} started"
                + (f" on {attempt.worker_id}" if attempt.worker_id else ""),
            )
        )
        if attempt.finished_at is not None:
            events.append((attempt.finished_at, f"attempt {attempt.attempt}: {attempt.outcome}"))
    if job.finished_at is not None:
        events.append((job.finished_at, f"finished: {job.status}"))
    return sorted(events, key=lambda e: e[0])


__all__ = ["create_app"]
