"""The web dashboard (``pip install 'pgqueue[dashboard]'``).

``create_app(app, read_only=False, authorize=None)`` returns an ASGI app to
serve (``pgqueue dashboard``) or mount in Starlette, FastAPI or Django-ASGI.
Importing this package imports Starlette and Jinja2; ``import pgqueue`` never does.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the pgqueue dashboard needs its extra: pip install 'pgqueue[dashboard]'"
    ) from exc

from pgqueue.dashboard.server import create_app

__all__ = ["create_app"]
