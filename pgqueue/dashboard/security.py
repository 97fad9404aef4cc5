"""HTTP hardening of the dashboard: response headers, where a redirect may
go, and the checks a browser's POST must pass (CSRF token, same origin).

Who may see and act (token, session, ``authorize``) is :mod:`.auth`; this
module only says what every response carries and what a request must prove.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request

from pgqueue.dashboard.auth import CSRF_FIELD, CSRF_HEADER, Guard

#: The environment variable holding the dashboard's token.
TOKEN_ENV = "PGQUEUE_DASHBOARD_TOKEN"
#: Seconds a failed login waits before answering: slows down guessing.
LOGIN_FAILURE_DELAY = 0.5

# Scripts and styles from this origin only: the pages inline nothing.
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


def root(request: Request) -> str:
    """The mount prefix of this dashboard ("" at the root)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def cookie_path(request: Request) -> str:
    """The path the dashboard's cookies are scoped to (its mount point)."""
    return root(request) + "/"


def safe_next(request: Request, form: FormData) -> str:
    """Where to go after an action: a same-site path only (no open redirect)."""
    prefix = root(request)
    value = form.get("next")
    if (
        isinstance(value, str)
        and value.startswith("/")
        and not value.startswith("//")
        and ("\\" not in value)
    ):
        return value if value.startswith(prefix + "/") else prefix + value
    return prefix + "/"


def without_flash(target: str) -> str:
    """``target`` without the message of an earlier action."""
    path, _, query = target.partition("?")
    kept = [
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in ("flash", "sig")
    ]
    return path + ("?" + urlencode(kept) if kept else "")


def csrf_submitted_ok(
    guard: Guard, request: Request, form: FormData, *, header: bool = False
) -> bool:
    """The form (or, with ``header``, the ``x-csrf-token`` header: what htmx
    sends) carries this browser's CSRF token."""
    submitted = form.get(CSRF_FIELD) or (request.headers.get(CSRF_HEADER) if header else None)
    return isinstance(submitted, str) and guard.csrf_ok(request, submitted)


def browser_post_refusal(guard: Guard, request: Request, form: FormData) -> str | None:
    """Why a browser's (cookie-authenticated) POST is refused, or None: it
    needs a valid CSRF token and, when the browser names an origin, this one."""
    if not csrf_submitted_ok(guard, request, form, header=True):
        return "missing or invalid CSRF token"
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        return f"cross-origin request from {origin}"
    return None
