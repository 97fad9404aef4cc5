"""The request plumbing every handler shares: authenticate, run, turn
pgqueue's errors into HTTP statuses, render a template, answer an action.

Handlers (:mod:`.pages`, :mod:`.login`, :mod:`.action_handlers`) are plain
module-level functions taking the :class:`Dashboard`; :meth:`Dashboard.page`
and :meth:`Dashboard.action` wrap them into Starlette endpoints.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import structlog
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

import pgqueue
from pgqueue.dashboard.auth import CSRF_COOKIE, CSRF_FIELD, Guard, Identity
from pgqueue.dashboard.data import Data
from pgqueue.dashboard.live import LiveHub
from pgqueue.dashboard.security import (
    SECURITY_HEADERS,
    TOKEN_ENV,
    browser_post_refusal,
    cookie_path,
    root,
    safe_next,
    without_flash,
)
from pgqueue.dashboard.views import NAV, environment
from pgqueue.errors import DatabaseError, InvalidInput, PgQueueError
from pgqueue.jsonable import to_jsonable

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.dashboard")

#: A page handler: the dashboard and the request in, a response out.
PageHandler = Callable[["Dashboard", Request], Awaitable[Response]]
#: An action handler: what it did (``target``, ``count``, ``message``, maybe
#: ``progress`` of a bulk action, and the fields the JSON answer shows).
ActionHandler = Callable[["Dashboard", Request, FormData], Awaitable[dict[str, Any]]]
Endpoint = Callable[[Request], Awaitable[Response]]


def _status(exc: PgQueueError, *, otherwise: int) -> int:
    """The HTTP status of a pgqueue error: 404 for whatever names nothing
    (every ``...NotFound`` is a LookupError: a job, a workflow, a schedule, a
    task), 400 for bad input, 503 when the database failed (unreachable,
    timed out, read-only: try again later), else ``otherwise``."""
    if isinstance(exc, LookupError):
        return 404
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, DatabaseError):
        return 503
    return otherwise


class Dashboard:
    """The state of one dashboard (App, access policy, reads, live updates,
    templates) and the wrappers that turn handlers into endpoints."""

    def __init__(self, app: App, guard: Guard, cache_ttl: float = 1.0) -> None:
        self.app = app
        self.guard = guard
        self.data = Data(app, ttl=cache_ttl)
        self.live = LiveHub(self.data, on_change=self.data.invalidate)
        self.env = environment()

    async def close(self) -> None:
        """Stop the live updates and close the pool of this event loop."""
        await self.live.close()
        await self.data.close()

    # --- responses -------------------------------------------------------------

    @staticmethod
    def url(request: Request, path: str, **params: Any) -> str:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return root(request) + path + ("?" + urlencode(query) if query else "")

    @staticmethod
    def wants_json(request: Request) -> bool:
        return request.url.path.startswith(
            root(request) + "/api/"
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
            path=request.url.path[len(root(request)) :] or "/",
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
                path=cookie_path(request),
                secure=request.url.scheme == "https",
            )
        return response

    def json(self, value: Any) -> JSONResponse:
        """``value`` as the CLI's ``--json`` would print it."""
        return JSONResponse(to_jsonable(value))

    def _flash(self, request: Request) -> str | None:
        """The message of the last action, only when this dashboard wrote it
        (a crafted link cannot put words on the page)."""
        message = request.query_params.get("flash")
        signature = request.query_params.get("sig", "")
        if message and self.guard.flash_ok(message, signature):
            return message
        return None

    def error(self, request: Request, status: int, message: str) -> Response:
        if self.wants_json(request) or not hasattr(request.state, "identity"):
            return JSONResponse({"error": message}, status_code=status)
        return self.render(
            request, "error.html", status_code=status, status=status, message=message
        )

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

    # --- wrappers --------------------------------------------------------------

    def page(self, handler: PageHandler) -> Endpoint:
        """Authenticate, run, turn pgqueue's errors into 400/404/503 (:func:`_status`)."""

        async def endpoint(request: Request) -> Response:
            refused = self._authenticate(request)
            if refused is not None:
                return refused
            try:
                response = await handler(self, request)
            except PgQueueError as exc:
                response = self.error(request, _status(exc, otherwise=503), str(exc))
            response.headers.update(SECURITY_HEADERS)
            return response

        return endpoint

    def public(self, handler: PageHandler) -> Endpoint:
        """A handler that needs no login (the health probe, the login form
        itself): it runs as it is."""

        async def endpoint(request: Request) -> Response:
            return await handler(self, request)

        return endpoint

    def action(self, name: str, handler: ActionHandler) -> Endpoint:
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
            # Bearer requests need no CSRF token: no browser sends that header on its own.
            if identity.method != "bearer" and (
                reason := browser_post_refusal(self.guard, request, form)
            ):
                return refuse(reason)
            if not await self.guard.allowed(request, name):
                return refuse(f"not allowed: {name}")
            try:
                outcome = await handler(self, request, form)
            except PgQueueError as exc:  # otherwise: e.g. cancelling a finished job
                return self.error(request, _status(exc, otherwise=409), str(exc))
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
            return self.json(body)
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
                back=safe_next(request, form),
            )
        else:
            target = without_flash(safe_next(request, form))
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
