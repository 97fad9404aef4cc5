"""``POST /v1/events/{key}``: send an event of durable tasks (a producer's
right), releasing the jobs waiting for it in the request's transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue.http import schemas

if TYPE_CHECKING:
    from starlette.requests import Request

    from pgqueue.http.api import Api


async def send_event(api: Api, request: Request) -> dict[str, Any]:
    """Body ``{"payload": <any JSON>}``, or ``{}`` or no body at all (a null
    payload); answers ``{key, released}``."""
    kind = api.authenticate(request, "producer", "enqueue")
    key = request.path_params["key"]
    body: dict[str, Any] = {}
    if not _empty(request):  # (whitespace is not an empty body: a 400, as elsewhere)
        body = schemas.SEND_EVENT.parse(await api.body(request), "")
    async with api.session(kind, atomic=True) as tx:
        released = await api.app.send_event_async(key, body.get("payload"), conn=tx.conn)
    return {"key": key, "released": released}


def _empty(request: Request) -> bool:
    """No body sent: ``Content-Length: 0``, or neither a length nor chunks."""
    headers = request.headers
    length = headers.get("content-length")
    if length is not None:
        return length.strip() == "0"
    return "transfer-encoding" not in headers
