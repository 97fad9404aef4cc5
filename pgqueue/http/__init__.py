"""The HTTP API (``pip install 'pgqueue[http]'``): JSON over HTTP for
producers and workers without a database connection.

``create_api(app, tokens=...)`` returns an ASGI app to serve (``pgqueue
serve``) or mount under any path. Importing this package imports Starlette;
``import pgqueue`` never does.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the pgqueue HTTP API needs its extra: pip install 'pgqueue[http]'") from exc

from pgqueue.http.api import create_api
from pgqueue.http.limits import Limits, parse_rates
from pgqueue.http.tokens import Tokens, hash_token

__all__ = ["Limits", "Tokens", "create_api", "hash_token", "parse_rates"]
