"""The messages between a worker and its child processes (``--pool process``):
one JSON object per frame, each frame a 4-byte big-endian length then UTF-8.

Worker to child: ``{"op": "run", "job": {...}}`` (one job: ids, task,
payload, tags, meta, group_key), ``{"op": "stop", "job_id": N}`` (``should_stop()``
turns true), ``{"op": "exit"}`` (finish and leave: the child is replaced).

Child to worker: ``{"op": "ready", "pid": N}`` once the app is imported, or
``{"op": "failed", "message": ...}``; ``{"op": "progress", "job_id", "text"}``
and ``{"op": "extend", "job_id", "seconds"}`` while a task runs; and
``{"op": "done", "job_id", "rss", ...}`` with either ``"result"`` (the
result's stored JSON text or null; ``"unstored"`` says why it was not
stored) or ``"failure"`` (how the exception is recorded: see
:func:`pgqueue.worker.executor.classify_exception`).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
#: The largest frame either side accepts (a payload or result is bounded far below).
MAX_FRAME = 256 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``."""
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> dict[str, Any]:
    """The message of one frame's body."""
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"a frame must hold a JSON object, got {type(message).__name__}")
    return message


def frame_length(header: bytes) -> int:
    """The body length a frame header announces (refusing absurd ones)."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    return int(length)


def read_blocking(sock: socket.socket) -> dict[str, Any] | None:
    """The next message on a blocking socket; None at end of stream."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, frame_length(header))
    if body is None:
        return None
    return decode(body)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
