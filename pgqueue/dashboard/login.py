"""The login form, login and logout: the session cookie of a browser when
the dashboard has a token (an API client sends ``Authorization: Bearer``)."""

from __future__ import annotations

import asyncio

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from pgqueue.dashboard.auth import SESSION_COOKIE, Identity
from pgqueue.dashboard.endpoints import Dashboard
from pgqueue.dashboard.security import (
    LOGIN_FAILURE_DELAY,
    SECURITY_HEADERS,
    cookie_path,
    csrf_submitted_ok,
    safe_next,
)

log = structlog.get_logger("pgqueue.dashboard")


async def login_form(dash: Dashboard, request: Request) -> Response:
    """GET ``/login``: the form (a redirect home when no token is configured)."""
    request.state.identity = dash.guard.identify(request)
    if not dash.guard.login_required:
        return RedirectResponse(dash.url(request, "/"), status_code=303)
    response = dash.render(
        request, "login.html", message=None, next=request.query_params.get("next", "/")
    )
    response.headers.update(SECURITY_HEADERS)
    return response


async def login(dash: Dashboard, request: Request) -> Response:
    """POST ``/login``: check the token, set the session cookie, go on."""
    guard = dash.guard
    request.state.identity = Identity(None, request.client.host if request.client else "")
    form = await request.form()
    if not csrf_submitted_ok(guard, request, form):
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
    redirect = RedirectResponse(safe_next(request, form), status_code=303)
    redirect.set_cookie(
        SESSION_COOKIE,
        guard.session_value(),
        httponly=True,
        samesite="strict",
        path=cookie_path(request),
        secure=request.url.scheme == "https",
    )
    return redirect


async def logout(dash: Dashboard, request: Request) -> Response:
    """POST ``/logout``: forget the session cookie."""
    form = await request.form()
    if not csrf_submitted_ok(dash.guard, request, form):
        return JSONResponse({"error": "missing or invalid CSRF token"}, status_code=403)
    response = RedirectResponse(dash.url(request, "/login"), status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))
    return response
