"""Enqueue: validation, task defaults, one statement per batch."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import Any

from pgqueue import validation
from pgqueue.errors import InvalidOption
from pgqueue.models import Enqueued, JobSpec
from pgqueue.ops import DEFAULT_TASK, EnqueueHook, Execute, Op, OpContext
from pgqueue.ops import producer_span as tracing
from pgqueue.payloads import encode_batch, encode_options, encode_payload, encode_payloads
from pgqueue.queries import QueryName, parameter_names


def before_enqueue(middleware: Sequence[EnqueueHook], specs: Sequence[JobSpec]) -> list[JobSpec]:
    """Each spec through every middleware's ``before_enqueue``, in order."""
    out = []
    for spec in specs:
        for m in middleware:
            spec = m.before_enqueue(spec)
            if not isinstance(spec, JobSpec):
                raise InvalidOption(
                    f"{type(m).__name__}.before_enqueue must return a pgqueue.JobSpec, "
                    f"got {type(spec).__name__}"
                )
        out.append(spec)
    return out


def job_object(ctx: OpContext, spec: JobSpec) -> dict[str, Any]:
    """The JSON object of one job for ``enqueue_batch``; keys equal to the
    database defaults are left out to keep large batches small."""
    return _JobBuilder(ctx).build(spec)


class _JobBuilder:
    """Builds job objects, validating each distinct set of options once: a
    batch of 20,000 jobs usually shares one task, queue and priority."""

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self.bases: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.dedup = False
        self.windowed = False  # some job has dedup_window or debounce
        self.labelled = False  # some job has tags or meta (not enqueue_job's parameters)
        self.queues: set[str] = set()  # for the trace span's name

    def build(self, spec: JobSpec) -> dict[str, Any]:
        key = (spec.task, spec.queue, spec.priority, spec.max_attempts)
        base = self.bases.get(key)
        if base is None:
            base = self.bases[key] = self._shared_base(key, spec)
        obj = {**base, "payload": validation.payload_object(spec.payload)}
        if spec.delay is not None:
            if spec.run_at is not None:
                raise InvalidOption("give run_at or delay, not both")
            if wait := validation.seconds("delay", spec.delay):
                obj["delay"] = wait
        elif spec.run_at is not None:
            obj["run_at"] = validation.aware("run_at", spec.run_at).isoformat()
        if spec.dedup_key is not None:
            obj["dedup_key"] = validation.key("dedup_key", spec.dedup_key)
            self.dedup = True
        if spec.serial_key is not None:
            obj["serial_key"] = validation.key("serial_key", spec.serial_key)
        if spec.group_key is not None:
            obj["group_key"] = validation.group_key(spec.group_key)
        if spec.dedup_window is not None or spec.debounce is not None:
            obj.update(_over_time(spec))
            self.windowed = True
        if spec.tags is not None and (tags := validation.tags(spec.tags)):
            obj["tags"] = tags
            self.labelled = True
        if spec.meta is not None:
            obj["meta"] = validation.meta(spec.meta)
            self.labelled = True
        return obj

    def _shared_base(self, key: tuple[Any, ...], spec: JobSpec) -> dict[str, Any]:
        """``_base``, remembered across calls (one enqueue after another with
        the same options validates them once) while the task's defaults are
        the same object. The types are part of the key: 1, 1.0 and True are
        equal keys, but only 1 is a valid priority."""
        key = (*key, *map(type, key))
        try:
            hit = _BASES.get(key)
        except TypeError:  # unhashable options: _base says what is wrong
            hit = None
        if hit is not None:
            defaults, base, queue = hit
            if self.ctx.task_defaults(spec.task) is defaults:
                self.queues.add(queue)
                return base
        base = self._base(spec)
        queue = base.get("queue", "" if base.get("lookup") else DEFAULT_TASK.queue)
        if len(_BASES) >= 1024:
            _BASES.clear()
        _BASES[key] = (self.ctx.task_defaults(spec.task), base, queue)
        return base

    def _base(self, spec: JobSpec) -> dict[str, Any]:
        task = validation.task_name(spec.task)
        defaults = self.ctx.task_defaults(task)
        obj: dict[str, Any] = {"task": task}
        if defaults is DEFAULT_TASK:
            # The App does not know the task: send only what the caller gave
            # (even values equal to the built-in defaults) and let the
            # database fill in the rest from the task registry.
            obj["lookup"] = True
            if spec.queue is not None:
                obj["queue"] = validation.queue_name(spec.queue)
                self.queues.add(obj["queue"])
            else:
                self.queues.add("")  # the database picks it (the registry's)
            if spec.priority is not None:
                obj["priority"] = validation.priority(spec.priority)
            if spec.max_attempts is not None:
                obj["max_attempts"] = validation.max_attempts(spec.max_attempts)
            return obj
        queue = validation.queue_name(spec.queue if spec.queue is not None else defaults.queue)
        self.queues.add(queue)
        if queue != DEFAULT_TASK.queue:
            obj["queue"] = queue
        if spec.priority is not None:
            obj["priority"] = validation.priority(spec.priority)
        if defaults.priority:
            # Which priority wins (the caller's, an operator's setting, this
            # task default, the registry's) is decided in one place, the SQL
            # function enqueue_resolve: both are sent as they are.
            obj["default_priority"] = defaults.priority
        max_attempts = validation.max_attempts(
            spec.max_attempts if spec.max_attempts is not None else defaults.max_attempts
        )
        if max_attempts != DEFAULT_TASK.max_attempts:
            obj["max_attempts"] = max_attempts
        if defaults.lease_seconds != DEFAULT_TASK.lease_seconds:
            obj["lease_seconds"] = defaults.lease_seconds
        if defaults.backoff is not None:
            obj["backoff"] = defaults.backoff
        return obj

    def batch(self, specs: Sequence[JobSpec]) -> str:
        """The ``enqueue_batch`` document for ``specs``, with the hints that
        spare the database a pass over the jobs."""
        jobs = [self.build(s) for s in specs]
        if self.windowed:  # enqueue_windowed takes the plain array
            return encode_batch(jobs, self.ctx.max_payload_bytes)
        return encode_batch(jobs, self.ctx.max_payload_bytes, self.dedup)

    def query(self) -> QueryName:
        """The statement for the batch built last."""
        return "job_enqueue_windowed" if self.windowed else "job_enqueue_batch"


# Validated job options by (task, queue, priority, max_attempts), with the
# task defaults they were made from and the queue for the trace span. Never
# mutated: job objects are copies.
_BASES: dict[tuple[Any, ...], tuple[Any, dict[str, Any], str]] = {}


def _over_time(spec: JobSpec) -> dict[str, float]:
    """The ``dedup_window``/``debounce`` keys of a job object, refusing what
    makes no sense (the SQL function checks the same)."""
    if spec.dedup_key is None:
        raise InvalidOption("dedup_window and debounce need a dedup_key")
    if spec.dedup_window is not None and spec.debounce is not None:
        raise InvalidOption(
            "give dedup_window (one job per key per window) or debounce (postpone and "
            "replace the queued job), not both"
        )
    if spec.dedup_window is not None:
        return {
            "dedup_window": validation.seconds("dedup_window", spec.dedup_window, allow_zero=False)
        }
    if spec.run_at is not None or spec.delay is not None:
        raise InvalidOption("debounce sets run_at to now + debounce: give no run_at or delay")
    return {"debounce": validation.seconds("debounce", spec.debounce)}


def enqueue_many(ctx: OpContext, specs: Sequence[JobSpec]) -> Op[list[Enqueued]]:
    """Enqueue every spec in one statement (all or nothing). Validates now,
    before any connection is taken."""
    if isinstance(specs, JobSpec | str | bytes) or not isinstance(specs, Sequence):
        raise InvalidOption("enqueue_many takes a list of pgqueue.JobSpec")
    if set(map(type, specs)) != {JobSpec}:  # (one C pass in the common case)
        for spec in specs:
            if not isinstance(spec, JobSpec):
                raise InvalidOption(f"enqueue_many takes JobSpec items, got {spec!r}")
    if not specs:
        return _nothing()
    if ctx.middleware:
        specs = before_enqueue(ctx.middleware, specs)
    # (Two C passes: a bulk enqueue is tens of thousands of specs.)
    if any(map(_DEPENDS_ON, specs)) or any(map(_ALLOW_FAILED, specs)):
        from pgqueue.ops.workflows import enqueue_dependent

        return enqueue_dependent(ctx, specs)
    builder = _JobBuilder(ctx)
    if len(specs) > 1 and not tracing.enabled():
        payloads = _only_payloads_differ(specs)
        if payloads is not None:
            return _insert_payloads(ctx, builder, specs, payloads)
    return _insert(builder.batch(specs), builder.queues, len(specs), builder.query())


def _only_payloads_differ(specs: Sequence[JobSpec]) -> tuple[Any, ...] | None:
    """The payloads, when the jobs share every other field and have no dedup
    key (the common bulk enqueue): then ``enqueue_payloads`` takes them."""
    first = specs[0]
    if first.dedup_key is not None or first.dedup_window is not None or first.debounce is not None:
        return None
    # Field by field, in C: a column whose every item equals its first (==,
    # as tuples compare) is shared.
    columns: list[tuple[Any, ...]] = list(zip(*specs, strict=True))
    for i, column in enumerate(columns):
        if i != _SPEC_PAYLOAD and column.count(column[0]) != len(column):
            return None
    return columns[_SPEC_PAYLOAD]


_SPEC_PAYLOAD = JobSpec._fields.index("payload")
_DEPENDS_ON = attrgetter("depends_on")
_ALLOW_FAILED = attrgetter("allow_failed")


def _insert_payloads(
    ctx: OpContext, builder: _JobBuilder, specs: Sequence[JobSpec], payloads: tuple[Any, ...]
) -> Op[list[Enqueued]]:
    job = builder.build(specs[0])  # validates the shared fields once
    del job["payload"]
    doc = encode_payloads(_payload_objects(payloads), ctx.max_payload_bytes)
    rows = yield Execute("job_enqueue_payloads", {"job": encode_options(job), "payloads": doc})
    # Enqueued(job_id, True) per id in C calls (a named tuple's own __new__ is
    # a Python call per job).
    return list(map(tuple.__new__, repeat(Enqueued), zip(rows[0][0], repeat(True))))


def _payload_objects(payloads: tuple[Any, ...]) -> list[dict[str, Any]]:
    """``validation.payload_object`` of every payload. The common case (every
    payload a dict with str keys) is checked in a few C passes; any other goes
    through the check one by one, which names what is wrong."""
    if set(map(type, payloads)) == {dict}:
        key_types = set(map(type, chain.from_iterable(payloads)))  # a dict iterates its keys
        if key_types <= {str}:
            return list(payloads)
    return [validation.payload_object(p) for p in payloads]


def enqueue_one(ctx: OpContext, spec: JobSpec) -> Op[Enqueued]:
    """Enqueue one job: through ``enqueue_job`` (scalar parameters, no batch
    document) unless it needs the batch functions (dedup_window/debounce, or
    a trace context to store)."""
    if ctx.middleware:
        (spec,) = before_enqueue(ctx.middleware, [spec])
    if spec.depends_on or spec.allow_failed:
        from pgqueue.ops.workflows import enqueue_dependent

        return _first(enqueue_dependent(ctx, [spec]))
    builder = _JobBuilder(ctx)
    job = builder.build(spec)
    if builder.windowed or builder.labelled or tracing.enabled():
        doc = encode_batch([job], ctx.max_payload_bytes)
        return _first(_insert(doc, builder.queues, 1, builder.query()))
    job["payload"] = encode_payload(job["payload"], ctx.max_payload_bytes)
    job.setdefault("lookup", False)
    return _insert_one(tuple(map(job.get, _ONE_FIELDS)))


def _insert_one(params: tuple[Any, ...]) -> Op[Enqueued]:
    row = yield Execute("job_enqueue_one", params, fetch="one", hot=True)
    return Enqueued(row[0], row[1])


# The parameters of job_enqueue_one in statement order (a field a job object
# leaves out is NULL).
_ONE_FIELDS = parameter_names("job_enqueue_one")


def _insert(
    doc: str, queues: set[str], count: int, query: QueryName = "job_enqueue_batch"
) -> Op[list[Enqueued]]:
    # In a PRODUCER span whose trace context is stored with the jobs, when tracing is on.
    # ("" marks a job whose queue the database picks: then no destination.)
    span = tracing.send_span([] if "" in queues else sorted(queues), count)
    if span is None:
        rows = yield Execute(query, {"jobs": doc})
        return [Enqueued(job_id, created) for job_id, created in rows]
    try:
        rows = yield Execute(
            "job_enqueue_batch_traced",
            {
                "jobs": doc,
                "trace_context": span.carrier,
                "windowed": query == "job_enqueue_windowed",
            },
        )
    except BaseException as exc:
        span.failed(exc)
        raise
    results = [Enqueued(job_id, created) for job_id, created in rows]
    span.sent([r.job_id for r in results])
    return results


def _first(op: Op[list[Enqueued]]) -> Op[Enqueued]:
    results = yield from op
    return results[0]


def _nothing() -> Op[list[Enqueued]]:
    return []
    yield  # pragma: no cover - makes this a generator
