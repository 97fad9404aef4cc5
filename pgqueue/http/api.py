"""The ASGI application of the HTTP API: authentication, bodies, answers.

Every request runs as the database role of its token's kind, on sessions
that start as that role (libpq ``options=-c role=...``). Enqueues and the
worker calls (lease, ack, fail, nack, extend; the SQL worker API, fenced by
attempt id in the database) run on the kind's own pool: a single statement
commits on its own, in one round trip; what must be atomic (a batch, a
lease with its length) runs in a transaction. Reads and operator calls the
public API offers without ``conn=`` (get, cancel, requeue, metrics) run on
an App of that role. So the database, not only this code, refuses what a
kind may not do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import pgqueue
from pgqueue import validation
from pgqueue.database import Database
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
from pgqueue.http.events import send_event
from pgqueue.http.limits import Category, Limits, retry_after
from pgqueue.http.listener import BATCH_WINDOW, Waiters
from pgqueue.http.openapi import openapi_document
from pgqueue.http.roles import resolve_roles
from pgqueue.http.schemas import ApiError
from pgqueue.http.tokens import RANK, Tokens
from pgqueue.http.upkeep import Upkeep
from pgqueue.jsonable import job_jsonable, to_jsonable
from pgqueue.ops import Op, worker_api
from pgqueue.worker.listener import KEEPALIVE

if TYPE_CHECKING:
    from pgqueue.app import App

log = logging.getLogger("pgqueue.http")
T = TypeVar("T")

DEFAULT_MAX_BODY = 1 << 20
#: application_name of the server's LISTEN session (open only while a long poll waits).
LISTEN_NAME = "pgqueue-http-listen"
Handler = Callable[[Request], Awaitable[Any]]
_OPTIONS = ("queue", "priority", "run_at", "delay", "max_attempts", "dedup_key", "serial_key",
            "tags", "meta", "depends_on", "group_key")  # fmt: skip


def enqueue_options(job: dict[str, Any]) -> dict[str, Any]:
    """Core enqueue keyword arguments from a checked body."""
    return {key: job[key] for key in _OPTIONS if job[key] is not None}


def _role_dsn(dsn: str, role: str) -> str:
    """``dsn`` whose sessions start as ``role`` (libpq ``options``)."""
    given = conninfo_to_dict(dsn)
    escaped = role.replace("\\", "\\\\").replace(" ", "\\ ")
    options = f"{given.get('options') or ''} -c role={escaped}".strip()
    return make_conninfo(dsn, options=options, application_name="pgqueue-http")


@dataclass(frozen=True, slots=True)
class Session:
    """A request's connection, as its token's role: ``run`` drives an
    operation on it; ``conn`` is for ``conn=`` of the App's enqueue."""

    database: Database
    conn: AsyncConnection[Any]

    async def run(self, op: Op[T]) -> T:
        return await self.database.run_async(op, self.conn)


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
        upkeep: Upkeep,
        limits: Limits,
        read_timeout: float,
    ) -> None:
        self.app = app
        self.upkeep = upkeep
        self.limits = limits
        self.read_timeout = read_timeout
        self.tokens = tokens
        self.given_roles = roles
        self.max_body_bytes = max_body_bytes
        self.pool_max_size = pool_max_size
        self.poll_interval = poll_interval
        self.max_wait = max_wait
        self.schema = app.schema
        self.lease_body = schemas.lease_body(max_wait)
        self.waiters = Waiters(self._listen)
        self.roles: dict[Kind, str | None] = {}
        self.role_apps: dict[Kind, App] = {}
        #: Per kind with a role: a pool whose sessions start as that role.
        self._pools: dict[Kind, Database] = {}
        self._database: Database | None = None
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
            database = self._pool(make_conninfo(self.app.dsn, application_name="pgqueue-http"))
            try:
                self.roles = await resolve_roles(
                    database, self.schema, self.tokens.kinds, self.given_roles
                )
            except BaseException:
                await database.close_async()
                raise
            for kind, role in self.roles.items():
                if role is not None:
                    self._pools[kind] = self._pool(_role_dsn(self.app.dsn, role))
                    self.role_apps[kind] = pgqueue.App(
                        _role_dsn(self.app.dsn, role),
                        self.schema,
                        pool_min_size=0,
                        pool_max_size=4,
                        listen=False,
                        pooler=self.app.pooler,
                    )
            self._database = database
            self.upkeep.start(database, self.app.op_context)
            self._ready = True

    def _pool(self, dsn: str) -> Database:
        return Database(
            dsn,
            self.app.op_context.queries,
            min_size=1,
            max_size=self.pool_max_size,
            timeout=10.0,
            transaction_pooler=self.app.pooler == "transaction",
        )

    def _listen(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[list[str]]]:
        """A LISTEN session of this server's database (for the waiters)."""
        assert self._database is not None
        return self._database.notification_batches_async(
            BATCH_WINDOW, application_name=LISTEN_NAME, **KEEPALIVE
        )

    def stop_waiting(self) -> None:
        """End every held long poll now with the jobs it has (none), and let
        no later one wait: call it when the server starts shutting down, on
        its event loop (``pgqueue serve`` does). Requests in flight finish;
        a server waits for them, and a long poll would otherwise hold it up
        to ``max_wait`` (uvicorn cancels it first: a 500)."""
        self.stopping = True
        self.waiters.wake_all()

    async def close(self) -> None:
        await self.upkeep.stop()
        await self.waiters.close()
        for role_app in self.role_apps.values():
            await role_app.close_async()
        self.role_apps.clear()
        for pool in self._pools.values():
            await pool.close_async()
        self._pools.clear()
        if self._database is not None:
            await self._database.close_async()
            self._database = None
        self._ready = False

    @contextlib.asynccontextmanager
    async def session(self, kind: Kind, *, atomic: bool = False) -> AsyncIterator[Session]:
        """A connection as the kind's role (this server's own user when the
        kind has none): each statement commits on its own, or, ``atomic``,
        all of them in one transaction."""
        await self.start()
        assert self._database is not None
        database = self._pools.get(kind, self._database)
        held = database.transaction_async() if atomic else database.connection_async()
        async with held as conn:
            yield Session(database, conn)

    def app_for(self, kind: Kind) -> App:
        """The App whose sessions run as the kind's role (this server's own
        App when the kind has none)."""
        return self.role_apps.get(kind, self.app)

    # --- requests -----------------------------------------------------------------

    def authenticate(self, request: Request, needed: Kind, category: Category) -> Kind:
        """The token's kind; 401 without a known token, 403 below ``needed``,
        429 past the token's rate for ``category``. The token's identity is
        left in ``request.state.token`` (for its long-poll cap)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        found = self.tokens.identify(token)
        if found is None:
            raise ApiError(401, "unauthorized", "unknown token")
        kind, identity = found
        if RANK[kind] < RANK[needed]:
            raise ApiError(403, "forbidden", f"a {kind} token may not do this (needs {needed})")
        self.limits.charge(identity, category)
        request.state.token = identity
        return kind

    async def body(self, request: Request, *, empty_ok: bool = False) -> Any:
        """The request's JSON value; 413 past the size limit, 400 when not JSON."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.read_timeout):  # a slow body holds no slot for long
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise _too_large(self.max_body_bytes)
                    chunks.append(chunk)
        except TimeoutError:
            raise ApiError(
                408, "timeout", f"the body did not arrive within {self.read_timeout:g}s"
            ) from None
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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the body is larger than {limit} bytes")


def error_response(error: ApiError) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if error.status == 401 else {}
    wait = retry_after(error)
    if wait is not None:
        headers["retry-after"] = wait
    return JSONResponse(error.body(), status_code=error.status, headers=headers or None)


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
    if isinstance(exc, PermissionDenied):
        # The server's own user and the grant hint are not the caller's business.
        reason = str(exc).splitlines()[0].split(" (role ")[0].split(": grant the role ")[0]
        return ApiError(403, "forbidden", f"the database role of this token refused: {reason}")
    if isinstance(exc, ConnectionFailed):
        return ApiError(503, "unavailable", "the database is unavailable; retry")
    if isinstance(exc, DatabaseError) and exc.transient:
        return ApiError(503, "unavailable", f"retry: {str(exc).splitlines()[0]}")
    if isinstance(exc, DatabaseError):
        state = exc.sqlstate or ""
        if state.startswith(("22", "23")):  # the input
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
            with api.limits.request():
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
    kind = api.authenticate(request, "producer", "enqueue")
    job = schemas.ENQUEUE.parse(await api.body(request))
    async with api.session(kind) as tx:  # one statement: commits on its own
        done = await api.app.enqueue_async(
            job["task"], job["payload"], conn=tx.conn, **enqueue_options(job)
        )
    return _enqueued({"job_id": done.job_id, "created": done.created}, done.created)


async def enqueue_batch(api: Api, request: Request) -> JSONResponse:
    kind = api.authenticate(request, "producer", "enqueue")
    jobs = schemas.ENQUEUE_BATCH.parse(await api.body(request))["jobs"]
    specs = [pgqueue.JobSpec(job["task"], job["payload"], **enqueue_options(job)) for job in jobs]
    if not specs:
        return _enqueued({"job_ids": [], "created": []}, False)
    async with api.session(kind, atomic=True) as tx:  # all or nothing
        done = await api.app.enqueue_many_async(specs, conn=tx.conn)
    created = [d.created for d in done]
    return _enqueued({"job_ids": [d.job_id for d in done], "created": created}, any(created))


async def get_job(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "producer", "read")
    job_id = schemas.job_id(request.path_params["id"])
    history = request.query_params.get("history", "false").lower()
    if history not in ("true", "false", "1", "0"):
        raise schemas.invalid("history", "must be true or false")
    await api.start()
    job = await api.app_for(kind).get_job_async(job_id, history=history in ("true", "1"))
    # The lease token stays with its holder: only an admin sees a running attempt's.
    return job_jsonable(job, lease_token=kind == "admin")


async def cancel(api: Api, request: Request) -> dict[str, Any]:
    # Producers may ask; their role decides (the default grant does not allow it).
    kind = api.authenticate(request, "producer", "admin")
    job_id = schemas.job_id(request.path_params["id"])
    await api.start()
    status = await api.app_for(kind).cancel_async(job_id)
    return {"job_id": job_id, "status": status.value}


async def requeue(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "admin", "admin")
    job_id = schemas.job_id(request.path_params["id"])
    await api.start()
    await api.app_for(kind).requeue_dead_async(job_id)
    return {"job_id": job_id, "status": "queued"}


async def metrics(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "producer", "read")
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
    kind = api.authenticate(request, "worker", "lease")
    queue = schemas.queue_name(request.path_params["queue"])
    body = api.lease_body.parse(await api.body(request, empty_ok=True))
    client = request.client.host if request.client else "unknown"
    worker_id = body["worker_id"] or f"http@{client}"
    count = body["max"] or 1
    wait = body["wait"] or 0.0
    await api.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    # A long poll holds a slot (globally and of its token) while it waits.
    polling = api.limits.long_poll(request.state.token) if wait > 0 else contextlib.nullcontext()
    with polling:
        event = api.waiters.register(queue) if wait > 0 else None
        try:
            while True:
                if event is not None:
                    event.clear()  # a notification from now on wakes the wait below
                jobs = await _lease_once(
                    api, kind, queue, worker_id, count, body["lease_seconds"]
                )
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
    # With its own length, the lease and its extension are one transaction.
    async with api.session(kind, atomic=seconds is not None) as tx:
        jobs = await tx.run(worker_api.lease(queue, worker_id, count))
        if jobs and seconds is not None:
            # extend() sets the lease to now() + seconds: now() is this transaction's start.
            expiry = await tx.run(
                worker_api.extend_many(
                    [j["job_id"] for j in jobs], [j["attempt_id"] for j in jobs], seconds
                )
            )
            for job in jobs:
                job["lease_expires_at"] = expiry.get(job["job_id"], job["lease_expires_at"])
    return jobs


async def _stale(tx: Session, job_id: int) -> ApiError:
    """404 for an unknown job, else 409 lease_lost."""
    state = await tx.run(worker_api.job_state(job_id))
    if state is None:
        return ApiError(404, "job_not_found", f"job {job_id} does not exist")
    return ApiError(
        409,
        "lease_lost",
        f"job {job_id} is not held under this attempt_id (it is {state.status}): nothing changed",
    )


def _result(api: Api, value: Any, field: str) -> str | None:
    """The JSON text of a result (None: no result); 422 past the App's limit."""
    if value is None:
        return None
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > api.app.max_result_bytes:
        raise schemas.invalid(field, f"is {size} bytes of JSON; at most {api.app.max_result_bytes}")
    return json.dumps(value)


async def ack(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker", "complete")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.ACK.parse(await api.body(request))
    result = _result(api, body["result"], "result")
    async with api.session(kind) as tx:
        if not await tx.run(worker_api.ack(job_id, body["attempt_id"], result)):
            raise await _stale(tx, job_id)
    return {"job_id": job_id, "acked": True}


async def fail(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker", "complete")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.FAIL.parse(await api.body(request))
    error = body["error"].replace("\x00", "\ufffd")  # text columns hold no NUL
    op = worker_api.fail(
        job_id, body["attempt_id"], error, body["retry_at"], bool(body["permanent"])
    )
    async with api.session(kind) as tx:
        status = await tx.run(op)
        if status is None:
            raise await _stale(tx, job_id)
    return {"job_id": job_id, "status": status}


async def nack(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker", "complete")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.NACK.parse(await api.body(request))
    async with api.session(kind) as tx:
        if not await tx.run(worker_api.nack(job_id, body["attempt_id"])):
            raise await _stale(tx, job_id)
    return {"job_id": job_id, "status": "queued"}


async def extend(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker", "complete")
    job_id = schemas.job_id(request.path_params["id"])
    body = schemas.EXTEND.parse(await api.body(request))
    async with api.session(kind) as tx:
        expires = await tx.run(worker_api.extend(job_id, body["attempt_id"], body["seconds"]))
        if expires is None:
            raise await _stale(tx, job_id)
        state = await tx.run(worker_api.job_state(job_id))
    return {
        "extended": True,
        "lease_expires_at": expires,
        "cancel_requested": bool(state and state.cancel_requested),
    }


async def ack_many(api: Api, request: Request) -> dict[str, Any]:
    kind = api.authenticate(request, "worker", "complete")
    acks = schemas.ACK_MANY.parse(await api.body(request))["acks"]
    job_ids = [a["job_id"] for a in acks]
    attempt_ids = [a["attempt_id"] for a in acks]
    results = [_result(api, a["result"], f"acks[{i}].result") for i, a in enumerate(acks)]
    async with api.session(kind) as tx:  # one statement, each pair fenced
        held = await tx.run(worker_api.ack_many(job_ids, attempt_ids, results))
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
    ("/v1/events/{key}", "POST", send_event),  # durable tasks (pgqueue/http/events.py)
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
    reaper: bool = True,
    maintenance: bool = True,
    reap_interval: float = 5.0,
    limits: Limits | None = None,
    read_timeout: float = 30.0,
) -> Starlette:
    """The HTTP API of ``app`` as an ASGI app (serve it, or mount it).

    ``tokens``: a :class:`Tokens`, the path of a token file (``KIND
    TOKEN_SHA256`` lines), or (kind, sha256) pairs. ``*_role``: the database
    role each kind runs as (default: the one ``pgqueue grant`` recorded).
    ``max_wait``: the longest long-poll a lease may ask for (seconds).
    ``reaper`` / ``maintenance``: take part in the fleet's upkeep as a
    worker does (reclaim expired leases every ``reap_interval`` seconds;
    the maintenance election), so that a fleet of HTTP workers only is
    whole (:mod:`pgqueue.http.upkeep`). ``limits``: requests and long polls
    in flight, per-token rates (:class:`pgqueue.http.Limits`; default: 1,000
    requests, 500 long polls, no per-token limit). ``read_timeout``: seconds
    a request's body may take to arrive (408 after).
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
        upkeep=Upkeep(reaper=reaper, maintenance=maintenance, reap_interval=reap_interval),
        limits=limits or Limits(),
        read_timeout=validation.seconds("read_timeout", read_timeout, allow_zero=False),
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
