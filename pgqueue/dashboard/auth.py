"""Who may see and act: the token, the session cookie, CSRF, read-only mode.

- No token configured (and no ``authorize`` callback): every page is readable
  and every action is refused with 403 — the dashboard says so on each page.
- ``PGQUEUE_DASHBOARD_TOKEN`` set: every page and API needs the token, sent as
  ``Authorization: Bearer <token>`` or through the login form, which sets an
  HttpOnly, SameSite=Strict session cookie (an HMAC of the token, never the
  token itself). A missing or wrong token is a 401.
- ``authorize(request, action) -> bool`` (mounted in a host application):
  the host authenticates; the callback decides each action (False: 403).
- Every POST from a browser carries a CSRF token bound to a per-browser
  cookie (double submit, HMAC-signed); Bearer requests need none, since no
  browser sends that header on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

SESSION_COOKIE = "pgqueue_session"
SESSION_SECONDS = 12 * 3600
"""How long a login lasts."""
CSRF_COOKIE = "pgqueue_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

Authorize = Callable[[Request, str], bool | Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: how they proved it (``None``: not at all)."""

    method: str | None  # "bearer", "cookie", "host" or None
    client: str

    @property
    def who(self) -> str:
        return f"{self.method or 'anonymous'}@{self.client}"


class Guard:
    """The access policy of one dashboard."""

    def __init__(self, token: str | None, *, read_only: bool, authorize: Authorize | None) -> None:
        self.token = token or None
        self.authorize = authorize
        self.read_only = read_only or (self.token is None and authorize is None)
        # Signs session and CSRF values; derived from the token when there is
        # one, so that sessions survive a restart and die when it changes.
        seed = self.token.encode() if self.token else secrets.token_bytes(32)
        self._key = hashlib.sha256(b"pgqueue-dashboard:" + seed).digest()

    # --- identity ----------------------------------------------------------------

    @property
    def login_required(self) -> bool:
        return self.token is not None

    def session_value(self, now: float | None = None) -> str:
        """A new session: nonce, expiry (unix seconds) and their signature."""
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        body = f"{secrets.token_urlsafe(16)}.{expires}"
        return f"{body}.{self._sign('session:' + body)}"

    def check_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def identify(self, request: Request) -> Identity:
        """The identity of a request; ``method=None`` when it proved nothing
        that this dashboard needs (with a token: not logged in)."""
        client = request.client.host if request.client else "unknown"
        if not self.login_required:
            return Identity("host" if self.authorize else None, client)
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.check_token(value.strip()):
            return Identity("bearer", client)
        body, _, signature = request.cookies.get(SESSION_COOKIE, "").rpartition(".")
        _, _, expires = body.partition(".")
        if (
            body
            and hmac.compare_digest(signature, self._sign("session:" + body))
            and expires.isdigit()
            and int(expires) > time.time()
        ):
            return Identity("cookie", client)
        return Identity(None, client)

    def bad_bearer(self, request: Request) -> bool:
        """True when an Authorization header was sent and is wrong."""
        return bool(request.headers.get("authorization")) and (
            self.identify(request).method != "bearer"
        )

    # --- CSRF --------------------------------------------------------------------

    def csrf_token(self, request: Request) -> tuple[str, str | None]:
        """The CSRF token for forms on this page, and a new cookie value to set
        when the browser has none yet."""
        cookie = request.cookies.get(CSRF_COOKIE)
        new = None
        if not cookie or len(cookie) > 100:
            cookie = new = secrets.token_urlsafe(16)
        return self._sign("csrf:" + cookie), new

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not submitted:
            return False
        return hmac.compare_digest(submitted, self._sign("csrf:" + cookie))

    def sign_flash(self, message: str) -> str:
        return self._sign("flash:" + message)

    def flash_ok(self, message: str, signature: str) -> bool:
        return hmac.compare_digest(signature, self.sign_flash(message))

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()[:40]

    # --- actions -----------------------------------------------------------------

    async def allowed(self, request: Request, action: str) -> bool:
        """Whether the ``authorize`` callback (when given) allows ``action``."""
        if self.authorize is None:
            return True
        verdict: Any = self.authorize(request, action)
        if hasattr(verdict, "__await__"):
            verdict = await verdict
        return bool(verdict)
