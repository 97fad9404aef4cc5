"""Operations written once, free of I/O.

An operation is a generator that yields :class:`Execute` (or LISTEN/wait)
steps and receives their results; :mod:`pgqueue.database` drives it on a sync
or an async connection. That is how every public method and its ``_async``
twin share one body (the pattern psycopg uses internally).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pgqueue.queries import Queries, QueryName, channel_for

if TYPE_CHECKING:
    from pgqueue.models import JobSpec

T = TypeVar("T")

Fetch = Literal["all", "one", "none"]
Rows = Literal["tuple", "dict"]


class EnqueueHook(Protocol):
    """What operations use of a middleware (:class:`pgqueue.Middleware`):
    its ``before_enqueue``. Named here so that ops import nothing above them."""

    def before_enqueue(self, spec: JobSpec) -> JobSpec: ...


@dataclass(frozen=True, slots=True)
class Execute:
    """Run one named statement; the result is a list of rows, one row (or
    None) for ``fetch="one"``, or the row count for ``fetch="none"``.
    ``params``: a mapping of the ``%(name)s`` parameters, or a tuple of them
    in the order of :func:`pgqueue.queries.parameter_names` (cheaper).
    ``raw_json``: json/jsonb columns come back undecoded (bytes), for one
    decode per batch (see :func:`pgqueue.payloads.loads_many`).
    ``hot``: a statement run over and over whose result is a few small rows
    (tuple rows, not raw_json): a pooled connection keeps its cursor, and
    with it the last result, for the next time."""

    query: QueryName
    params: Mapping[str, Any] | tuple[Any, ...] = field(default_factory=dict)
    fetch: Fetch = "all"
    rows: Rows = "tuple"
    raw_json: bool = False
    hot: bool = False


@dataclass(frozen=True, slots=True)
class Listen:
    """LISTEN on the schema's channel (undone when the operation ends)."""


@dataclass(frozen=True, slots=True)
class WaitNotify:
    """Wait up to ``timeout`` seconds for the notification ``payload``; the
    result is True when it came, False on timeout."""

    timeout: float
    payload: str


Step = Execute | Listen | WaitNotify
Op = Generator[Step, Any, T]


@dataclass(frozen=True, slots=True)
class TaskDefaults:
    """What a registered task contributes to jobs enqueued under its name."""

    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    lease_seconds: int = 60
    backoff: list[float] | None = None  # None: the default Backoff


DEFAULT_TASK = TaskDefaults()


@dataclass(frozen=True, slots=True)
class OpContext:
    """What operations need to know about their App."""

    schema: str
    queries: Queries
    max_payload_bytes: int
    max_result_bytes: int
    task_defaults: Callable[[str], TaskDefaults]
    clock: Callable[[], datetime | None]
    #: The App's middleware list (shared: add_middleware appends to it).
    middleware: Sequence[EnqueueHook] = field(default_factory=list)

    @property
    def channel(self) -> str:
        return channel_for(self.schema)
