"""The ASGI application of the HTTP API: authentication, bodies, answers.

Every request runs as the database role of its token's kind. Enqueues and
the worker calls (lease, ack, fail, nack, extend) run in a transaction on
this server's pool after ``SET LOCAL ROLE`` (the worker calls are the SQL
worker API, fenced by attempt id in the database); reads and operator calls
the public API offers without ``conn=`` (get, cancel, requeue, metrics) run
on an App whose sessions start as that role. So the database, not only this
code, refuses what a kind may not do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import pgqueue
from pgqueue.connection import SESSION_SETUP
from pgqueue.errors import (
    ConnectionFailed,
    DatabaseError,
    InvalidInput,
    InvalidJobState,
    JobNotFound,
    LeaseLost,
    PermissionDenied,
)
from pgqueue.grants import Kind
from pgqueue.http import schemas
from pgqueue.http.listener import Waiters
from pgqueue.http.openapi import openapi_document
from pgqueue.http.roles import resolve_roles
from pgqueue.http.schemas import ApiError
from pgqueue.http.tokens import RANK, Tokens
from pgqueue.jsonable import to_jsonable

if TYPE_CHECKING:
    from pgqueue.app import App

log = logging.getLogger("pgqueue.http")

DEFAULT_MAX_BODY = 1 << 20
Handler = Callable[[Request], Awaitable[Any]]
_OPTIONS = ("queue", "priority", "run_at", "delay", "max_attempts", "dedup_key", "serial_key",
            "tags", "meta", "depends_on")  # fmt: skip


def enqueue_options(job: dict[str, Any]) -> dict[str, Any]:
    """Core enqueue keyword arguments from a checked body."""
    return {key: job[key] for key in _OPTIONS if job[key] is not None}


def _role_dsn(dsn: str, role: str) -> str:
    """``dsn`` whose sessions start as ``role`` (libpq ``options``)."""
    given = conninfo_to_dict(dsn)
    escaped = role.replace("\\", "\\\\").replace(" ", "\\ ")
    options = f"{given.get('options') or ''} -c role={escaped}".strip()
    return make_conninfo(dsn, options=options, application_name="pgqueue-http")


class Api:
    """The state of one HTTP API: pool, roles, long-poll waiters."""

    def __init__(
        self,
        app: App,
        tokens: Tokens,
        *,
        roles: dict[Kind, str | None],
        max_body_bytes: int,
        pool_max_size: int,
        poll_interval: float,
        max_wait: float,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.given_roles = roles
        self.max_body_bytes = max_body_bytes
        self.pool_max_size = pool_max_size
        self.poll_interval = poll_interval
        self.max_wait = max_wait
        self.schema = app.schema
        self.lease_body = schemas.lease_body(max_wait)
        self.waiters = Waiters(app)
        self.roles: dict[Kind, str | None] = {}
        self.role_apps: dict[Kind, App] = {}
        self._pool: AsyncConnectionPool | None = None
        self._ready = False
        #: The server is shutting down: long polls end now, with no jobs.
        self.stopping = False
        self._lock = asyncio.Lock()
        #: Kinds whose grant cannot read queue metrics: read as this server (see metrics).
        self.metrics_as_server: set[Kind] = set()
        self.openapi_bytes: bytes | None = None

    # --- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        """Open the pool and resolve the roles (on first use when mounted:
        a mounted app gets no lifespan events)."""
        if self._ready:
            return
        async with self._lock:
            if self._ready:
                return
            setup = None if self.app.pooler == "transaction" else SESSION_SETUP
            pool: AsyncConnectionPool = AsyncConnectionPool(
                make_conninfo(self.app.dsn, application_name="pgqueue-http"),
                min_size=1,
                max_size=self.pool_max_size,
                kwargs={"autocommit": True},
                configure=_configure(setup),
                open=False,
                timeout=10.0,
            )
            await pool.open()
            try:
                async with pool.connection() as conn:
                    self.roles = await resolve_roles(
                        conn, self.schema, self.tokens.kinds, self.given_roles
                    )
            except BaseException:
                await pool.close()
                raise
            for kind, role in self.roles.items():
                if role is not None:
                    self.role_apps[kind] = pgqueue.App(
                        _role_dsn(self.app.dsn, role),
                        self.schema,
                        pool_min_size=0,
                        pool_max_size=4,
                        listen=False,
                        pooler=self.app.pooler,
                    )
            self._pool = pool
            self._ready = True

    def stop_waiting(self) -> None:
        """End every held long poll now with the jobs it has (none), and let
        no later one wait: call it when the server starts shutting down, on
        its event loop (``pgqueue serve`` does). Requests in flight finish;
        a server waits for them, and a long poll would otherwise hold it up
        to ``max_wait`` (uvicorn cancels it first: a 500)."""
        self.stopping = True
        self.waiters.wake_all()

    async def close(self) -> None:
        await self.waiters.close()
        for role_app in self.role_apps.values():
            await role_app.close_async()
        self.role_apps.clear()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self._ready = False

    @contextlib.asynccontextmanager
    async def transaction(self, kind: Kind) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction, as the kind's role."""
        await self.start()
        assert self._pool is not None
        async with self._pool.connection() as conn, conn.transaction():
            role = self.roles.get(kind)
            if role is not None:
                await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            yield conn

    def app_for(self, kind: Kind) -> App:
        """The App whose sessions run as the kind's role (this server's own
        App when the kind has none)."""
        return self.role_apps.get(kind, self.app)

    def fn(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name)

    # --- requests -----------------------------------------------------------------

    def authenticate(self, request: Request, needed: Kind) -> Kind:
        """The token's kind; 401 without a known token, 403 below ``needed``."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        kind = self.tokens.kind_of(token)
        if kind is None:
            raise ApiError(401, "unauthorized", "unknown token")
        if RANK[kind] < RANK[needed]:
            raise ApiError(403, "forbidden", f"a {kind} token may not do this (needs {needed})")
        return kind

    async def body(self, request: Request, *, empty_ok: bool = False) -> Any:
        """The request's JSON value; 413 past the size limit, 400 when not JSON."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _too_large(self.max_body_bytes)
            chunks.append(chunk)
        data = b"".join(chunks)
        if not data.strip():
            if empty_ok:
                return {}
            raise ApiError(400, "invalid_body", "the body must be a JSON object")
        try:
            return json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ApiError(400, "invalid_json", f"the body is not valid JSON: {reason}") from None


def _configure(
    setup: str | None,
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        if setup:
            await conn.execute(setup)

    return configure


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the body is larger than {limit} bytes")


def error_response(error: ApiError) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def translate(exc: BaseException) -> ApiError | None:
    """The answer for an error of the core or the driver (None: a bug)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, LeaseLost):
        return ApiError(409, "lease_lost", str(exc))
    if isinstance(exc, JobNotFound):
        return ApiError(404, "job_not_found", str(exc))
    if isinstance(exc, InvalidJobState):
        return ApiError(409, "invalid_state", str(exc))
    if isinstance(exc, InvalidInput):
        return ApiError(422, "invalid_input", str(exc))
    if isinstance(exc, PermissionDenied | psycopg.errors.InsufficientPrivilege):
        reason = str(exc).splitlines()[0].split(" (role ")[0]  # the role is the server's user
        return ApiError(403, "forbidden", f"the database role of this token refused: {reason}")
    if isinstance(exc, ConnectionFailed | PoolTimeout | psycopg.OperationalError):
        return ApiError(503, "unavailable", "the database is unavailable; retry")
    if isinstance(exc, DatabaseError) and exc.transient:
        return ApiError(503, "unavailable", f"retry: {str(exc).splitlines()[0]}")
    if isinstance(exc, psycopg.Error | DatabaseError):
        state = getattr(exc, "sqlstate", None) or ""
        if state.startswith(("22", "23")) or isinstance(exc, psycopg.DataError):  # the input
            return ApiError(422, "invalid_input", str(exc).splitlines()[0])
        if state.startswith(("40", "55", "57", "53")):
            return ApiError(503, "unavailable", f"retry: {str(exc).splitlines()[0]}")
    return None


QUERY = {"get_job": ("history",)}  # the query parameters a handler takes


def endpoint(api: Api, handler: Callable[[Api, Request], Awaitable[Any]]) -> Handler:
    """A route handler answering JSON, errors as ``{error, message}``."""

    allowed = QUERY.get(handler.__name__, ())

    async def run(request: Request) -> Response:
        try:
            for name in request.query_params:
                if name not in allowed:
                    raise schemas.invalid(name or "?", "unknown query parameter")
            result = await handler(api, request)
        except Exception as exc:
            error = translate(exc)
            if error is None:
                log.exception("pgqueue http: %s %s failed", request.method, request.url.path)
                error = ApiError(500, "internal", "internal error (logged by the server)")
            return error_response(error)
        if isinstance(result, Response):
            return result
        return JSONResponse(to_jsonable(result))

    return run


# --- handlers -------------------------------------------------------------------------


def _enqueued(body: dict[str, Any], created: bool) -> JSONResponse:
    """201 when a job was created, 200 when none was (a dedup key's live job)."""
    return JSONResponse(body, status_code=201 if created else 200)


async def enqueue(api: Api, request: Request) -> JSONResponse:
    kind = api.authenticate(request, "producer")
    job = schemas.ENQUEUE.parse(await api.body(request))
    async with api.transaction(kind) as conn:
        done = await api.app.enqueue_async(
            job["task"], job["payload"], conn=conn, **enqueue_options(job)
        )
    return _enqueued({"job_id": done.job_id, "created": done.created}, done.created)


async def enqueue_batch(api: Api, request: Request) -> JSONResponse:
    kind = api.authenticate(request, "producer")
    jobs = schemas.ENQUEUE_BATCH.parse(await api.body(request))["jobs"]
    specs = [pgqueue.JobSpec(job["task"], job["payload"], **enqueue_options(job)) for job in jobs]
    if not specs:
        return _enqueued({"job_ids": [], "created": []}, False)
    async with api.transaction(kind) as conn:  # all or nothing
        done = await api.app.enqueue_many_async(specs, conn=conn)
    created = [d.created for d in done]
    return _enqueued({"job_ids": [d.job_id for d in done], "created": created}, any(created))


async def get_job(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "producer")
    job_id = schemas.job_id(request.path_params["id"])
    history = request.query_params.get("history", "false").lower()
    if history not in ("true", "false", "1", "0"):
        raise schemas.invalid("history", "must be true or false")
    await api.start()
    job = await api.app_for(kind).get_job_async(job_id, history=history in ("true", "1"))
    out: dict[str, Any] = to_jsonable(job)
    if job.attempt_history is None:
        out.pop("attempt_history", None)
    return out


async def cancel(api: Api, request: Request) -> dict[str, Any]:
    # Producers may ask; their role decides (the default grant does not allow it).
    kind = api.authenticate(request, "producer")
    job_id = schemas.job_id(request.path_params["id"])
    await api.start()
    status = await api.app_for(kind).cancel_async(job_id)
    return {"job_id": job_id, "status": status.value}


async def requeue(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "admin")
    job_id = schemas.job_id(request.path_params["id"])
    await api.start()
    await api.app_for(kind).requeue_dead_async(job_id)
    return {"job_id": job_id, "status": "queued"}


async def metrics(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "producer")
    queue = schemas.queue_name(request.path_params["queue"])
    await api.start()
    found: dict[str, pgqueue.QueueMetrics] | None = None
    if kind not in api.metrics_as_server:
        try:
            found = await api.app_for(kind).metrics_async(queue)
        except PermissionDenied:
            # Every kind may read queue metrics; the producer grant cannot
            # read every table they come from: a fixed read as this server.
            api.metrics_as_server.add(kind)
    if found is None:
        found = await api.app.metrics_async(queue)
    counts = found.get(queue) or pgqueue.QueueMetrics(0, 0, 0, 0, 0, 0, None, False)
    return {"queue": queue, **to_jsonable(counts)}


async def lease(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    queue = schemas.queue_name(request.path_params["queue"])
    body = api.lease_body.parse(await api.body(request, empty_ok=True))
    client = request.client.host if request.client else "unknown"
    worker_id = body["worker_id"] or f"http@{client}"
    count = body["max"] or 1
    wait = body["wait"] or 0.0
    await api.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    event = api.waiters.register(queue) if wait > 0 else None
    try:
        while True:
            if event is not None:
                event.clear()  # a notification from now on wakes the wait below
            jobs = await _lease_once(api, kind, queue, worker_id, count, body["lease_seconds"])
            left = deadline - loop.time()
            if jobs or left <= 0 or event is None or api.stopping:
                break
            if await request.is_disconnected():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(left, api.poll_interval))
            if api.stopping:  # woken by the shutdown: answer now, lease nothing more
                break
    finally:
        if event is not None:
            api.waiters.unregister(queue, event)
    if len(jobs) == count:
        api.waiters.wake(queue)  # a full batch: there may be more for the next waiter
    return {"jobs": jobs}


async def _lease_once(
    api: Api, kind: Kind, queue: str, worker_id: str, count: int, seconds: int | None
) -> list[dict[str, Any]]:
    async with api.transaction(kind) as conn:
        rows = await (
            await conn.execute(
                sql.SQL(
                    "SELECT job_id, attempt_id, attempt, task, payload, lease_expires_at"
                    " FROM {}(ARRAY[%s]::text[], %s, %s)"
                ).format(api.fn("lease")),
                (queue, worker_id, count),
            )
        ).fetchall()
        jobs = [
            {"job_id": r[0], "attempt_id": r[1], "attempt": r[2], "task": r[3],
             "payload": r[4], "lease_expires_at": r[5]}
            for r in rows
        ]  # fmt: skip
        if jobs and seconds is not None:
            # extend() sets the lease to now() + seconds: now() is this transaction's start.
            extended = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT t.job_id, now() + make_interval(secs => %s)"
                        " FROM unnest(%s::bigint[], %s::bigint[]) AS t(job_id, attempt_id)"
                        " WHERE {}(t.job_id, t.attempt_id, %s)"
                    ).format(api.fn("extend")),
                    (seconds, [j["job_id"] for j in jobs], [j["attempt_id"] for j in jobs],
                     seconds),
                )
            ).fetchall()  # fmt: skip
            expiry = dict(extended)
            for job in jobs:
                job["lease_expires_at"] = expiry.get(job["job_id"], job["lease_expires_at"])
    return jobs


async def _stale(conn: psycopg.AsyncConnection[Any], api: Api, job_id: int) -> ApiError:
    """404 for an unknown job, else 409 lease_lost."""
    row = await (
        await conn.execute(
            sql.SQL("SELECT status FROM {}(%s)").format(api.fn("job_status")), (job_id,)
        )
    ).fetchone()
    if row is None:
        return ApiError(404, "job_not_found", f"job {job_id} does not exist")
    return ApiError(
        409,
        "lease_lost",
        f"job {job_id} is not held under this attempt_id (it is {row[0]}): nothing changed",
    )


def _result(api: Api, value: Any, field: str) -> Jsonb | None:
    if value is None:
        return None
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > api.app.max_result_bytes:
        raise schemas.invalid(field, f"is {size} bytes of JSON; at most {api.app.max_result_bytes}")
    return Jsonb(value)


async def ack(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.ACK.parse(await api.body(request))
    result = _result(api, body["result"], "result")
    async with api.transaction(kind) as conn:
        row = await (
            await conn.execute(
                sql.SQL("SELECT {}(%s, %s, %s::jsonb)").format(api.fn("ack")),
                (job_id, body["attempt_id"], result),
            )
        ).fetchone()
        if not (row and row[0]):
            raise await _stale(conn, api, job_id)
    return {"job_id": job_id, "acked": True}


async def fail(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.FAIL.parse(await api.body(request))
    error = body["error"].replace("\x00", "\ufffd")  # text columns hold no NUL
    params = (job_id, body["attempt_id"], error, body["retry_at"], bool(body["permanent"]))
    async with api.transaction(kind) as conn:
        query = sql.SQL("SELECT {}(%s, %s, %s, %s, %s)").format(api.fn("fail"))
        row = await (await conn.execute(query, params)).fetchone()
        if not (row and row[0]):
            raise await _stale(conn, api, job_id)
    return {"job_id": job_id, "status": row[0]}


async def nack(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.NACK.parse(await api.body(request))
    async with api.transaction(kind) as conn:
        row = await (
            await conn.execute(
                sql.SQL("SELECT {}(%s, %s)").format(api.fn("nack")), (job_id, body["attempt_id"])
            )
        ).fetchone()
        if not (row and row[0]):
            raise await _stale(conn, api, job_id)
    return {"job_id": job_id, "status": "queued"}


async def extend(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.EXTEND.parse(await api.body(request))
    async with api.transaction(kind) as conn:
        row = await (
            await conn.execute(
                sql.SQL("SELECT {}(%s, %s, %s), now() + make_interval(secs => %s)").format(
                    api.fn("extend")
                ),
                (job_id, body["attempt_id"], body["seconds"], body["seconds"]),
            )
        ).fetchone()
        if not (row and row[0]):
            raise await _stale(conn, api, job_id)
        status = await (
            await conn.execute(
                sql.SQL("SELECT cancel_requested FROM {}(%s)").format(api.fn("job_status")),
                (job_id,),
            )
        ).fetchone()
    return {
        "extended": True,
        "lease_expires_at": row[1],
        "cancel_requested": bool(status and status[0]),
    }


async def ack_many(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker")
    acks = schemas.ACK_MANY.parse(await api.body(request))["acks"]
    job_ids = [a["job_id"] for a in acks]
    attempt_ids = [a["attempt_id"] for a in acks]
    results = [_result(api, a["result"], f"acks[{i}].result") for i, a in enumerate(acks)]
    async with api.transaction(kind) as conn:
        if all(r is None for r in results):
            query = sql.SQL("SELECT job_id FROM {}(%s::bigint[], %s::bigint[])").format(
                api.fn("ack_many")
            )
            params: tuple[Any, ...] = (job_ids, attempt_ids)
        else:  # with results: still one statement, each pair fenced by ack()
            query = sql.SQL(
                "SELECT t.job_id FROM unnest(%s::bigint[], %s::bigint[], %s::jsonb[])"
                " WITH ORDINALITY AS t(job_id, attempt_id, result, n)"
                " WHERE {}(t.job_id, t.attempt_id, t.result) ORDER BY t.n"
            ).format(api.fn("ack"))
            params = (job_ids, attempt_ids, results)
        rows = await (await conn.execute(query, params)).fetchall()
    held = {r[0] for r in rows}
    acked = [j for j in dict.fromkeys(job_ids) if j in held]
    return {"acked": acked, "lease_lost": [j for j in job_ids if j not in held]}


async def openapi(api: Api, request: Request) -> Response:
    if api.openapi_bytes is None:  # built once: it describes this server's fixed limits
        api.openapi_bytes = json.dumps(openapi_document(api)).encode()
    return Response(api.openapi_bytes, media_type="application/json")


ROUTES: tuple[tuple[str, str, Callable[[Api, Request], Awaitable[Any]]], ...] = (
    ("/v1/jobs", "POST", enqueue),
    ("/v1/jobs/batch", "POST", enqueue_batch),
    ("/v1/jobs/{id}", "GET", get_job),
    ("/v1/jobs/{id}/cancel", "POST", cancel),
    ("/v1/jobs/{id}/requeue", "POST", requeue),
    ("/v1/jobs/{id}/ack", "POST", ack),
    ("/v1/jobs/{id}/fail", "POST", fail),
    ("/v1/jobs/{id}/nack", "POST", nack),
    ("/v1/jobs/{id}/extend", "POST", extend),
    ("/v1/ack", "POST", ack_many),
    ("/v1/queues/{queue}/lease", "POST", lease),
    ("/v1/queues/{queue}/metrics", "GET", metrics),
    ("/v1/openapi.json", "GET", openapi),
)


def create_api(
    app: App,
    tokens: Tokens | str | Path | Iterable[tuple[str, str]],
    *,
    producer_role: str | None = None,
    worker_role: str | None = None,
    admin_role: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    pool_max_size: int = 10,
    poll_interval: float = 2.0,
    max_wait: float = 20.0,
) -> Starlette:
    """The HTTP API of ``app`` as an ASGI app (serve it, or mount it).

    ``tokens``: a :class:`Tokens`, the path of a token file (``KIND
    TOKEN_SHA256`` lines), or (kind, sha256) pairs. ``*_role``: the database
    role each kind runs as (default: the one ``pgqueue grant`` recorded).
    ``max_wait``: the longest long-poll a lease may ask for (seconds).
    ``poll_interval``: how often a long-polling lease looks again without a
    notification (jobs that become due later send none). A host that serves
    it calls ``web.state.api.stop_waiting()`` when it starts shutting down,
    so that held long polls answer ``{"jobs": []}`` at once instead of
    holding the shutdown up (``pgqueue serve`` does).
    """
    if not isinstance(tokens, Tokens):
        tokens = Tokens.from_file(tokens) if isinstance(tokens, str | Path) else Tokens(tokens)
    api = Api(
        app,
        tokens,
        roles={"producer": producer_role, "worker": worker_role, "admin": admin_role},
        max_body_bytes=max_body_bytes,
        pool_max_size=pool_max_size,
        poll_interval=poll_interval,
        max_wait=max_wait,
    )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = error_response(ApiError(exc.status_code, code, str(exc.detail)))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await api.start()
        try:
            yield
        finally:
            await api.close()

    routes = [Route(path, endpoint(api, fn), methods=[method]) for path, method, fn in ROUTES]
    web = Starlette(
        routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan
    )
    web.state.api = api
    return web
