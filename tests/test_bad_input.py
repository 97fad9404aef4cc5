"""Every rejected input gets its pgqueue.errors type, a clear message, and writes nothing."""

from __future__ import annotations

import asyncio
import functools
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgqueue
from pgqueue.migrate import upgrade
from tests.fixtures.cluster import (
    create_database,
    drop_database,
    unique_db_name,
    with_dbname,
)
from tests.fixtures.dbstate import snapshot

UNREACHABLE_DSN = "postgresql://postgres@127.0.0.1:1/x"


@pytest.fixture(scope="module")
def db_dsn(
    pg_server_dsn: str, template_db: str, clone_strategy: Literal["FILE_COPY"] | None
) -> Iterator[str]:
    """One fresh database for this whole module (per xdist worker), not one per test:
    every test here compares the database before and after the rejected call itself,
    so sharing it costs no isolation and saves a hundred clones."""
    name = unique_db_name("pgq_badinput")
    dsn = create_database(pg_server_dsn, name, template=template_db, strategy=clone_strategy)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)


def label(value: object) -> str:
    """A test id that is the same in every xdist worker (no memory addresses)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def assert_rejected(
    db_dsn: str,
    error: type[BaseException],
    call: Callable[[], object],
    match: str | None = None,
) -> BaseException:
    """``call`` raises ``error`` (message matching ``match``) and the database is unchanged."""
    before = snapshot(db_dsn)
    with pytest.raises(error, match=match) as caught:
        call()
    assert snapshot(db_dsn) == before
    return caught.value


def test_input_errors_are_value_and_type_errors() -> None:
    for cls in (
        pgqueue.InvalidPayload,
        pgqueue.PayloadTooLarge,
        pgqueue.InvalidName,
        pgqueue.InvalidDuration,
        pgqueue.InvalidOption,
    ):
        assert issubclass(cls, ValueError)
        assert issubclass(cls, pgqueue.PgQueueError)
    assert issubclass(pgqueue.InvalidOption, TypeError)
    assert issubclass(pgqueue.PayloadTooLarge, pgqueue.InvalidPayload)
    assert issubclass(pgqueue.ConnectionFailed, pgqueue.PgQueueError)
    assert issubclass(pgqueue.SchemaNotMigrated, pgqueue.PgQueueError)


# --- payloads -------------------------------------------------------------------------


class Opaque:
    pass


NOT_AN_OBJECT: list[Any] = [[1, 2], "text", 42, 1.5, True, ("a", 1)]
NOT_SERIALISABLE: list[Any] = [
    {"a": Opaque()},
    {"a": {1, 2}},
    {"a": b"bytes"},
    {"a": float("nan")},
    {"a": math.inf},
    {"nested": {"deeper": [1, Opaque()]}},
    {1: "non-string key"},
]
HOLDS_NUL: list[Any] = [
    {"a": "x\x00y"},
    {"a\x00b": 1},
    {"a": ["ok", {"b": "\x00"}]},
]
HOLDS_LONE_SURROGATE: list[Any] = [
    {"a": "\ud800"},
    {"\udfff": 1},
    {"a": ["ok", {"b": "x\udc80y"}]},
]


@pytest.mark.parametrize("payload", NOT_AN_OBJECT, ids=label)
def test_payload_that_is_not_an_object(app: pgqueue.App, db_dsn: str, payload: Any) -> None:
    error = assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: app.enqueue("t", payload))
    assert "object" in str(error)


@pytest.mark.parametrize("payload", NOT_SERIALISABLE, ids=label)
def test_payload_that_is_not_serialisable(app: pgqueue.App, db_dsn: str, payload: Any) -> None:
    assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: app.enqueue("t", payload))


def test_task_enqueue_with_unserialisable_argument(app: pgqueue.App, db_dsn: str) -> None:
    @app.task
    def send(when: Any) -> None: ...

    assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: send.enqueue(when=Opaque()))


@pytest.mark.parametrize("payload", HOLDS_NUL, ids=label)
def test_payload_with_a_nul_character(app: pgqueue.App, db_dsn: str, payload: Any) -> None:
    error = assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: app.enqueue("t", payload))
    assert "NUL" in str(error)


@pytest.mark.parametrize("payload", HOLDS_LONE_SURROGATE, ids=label)
def test_payload_with_a_lone_surrogate(app: pgqueue.App, db_dsn: str, payload: Any) -> None:
    assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: app.enqueue("t", payload))


@pytest.fixture
def small_app(db_dsn: str) -> Iterator[pgqueue.App]:
    """An App whose payloads may hold at most 100 bytes of JSON."""
    with pgqueue.App(dsn=db_dsn, max_payload_bytes=100) as limited:
        yield limited


def test_payload_over_the_configured_limit(small_app: pgqueue.App, db_dsn: str) -> None:
    small_app.enqueue("t", {"a": "x" * 60})  # well under the limit

    error = assert_rejected(
        db_dsn, pgqueue.PayloadTooLarge, lambda: small_app.enqueue("t", {"a": "x" * 150})
    )
    assert "100" in str(error)


def test_payload_limit_counts_bytes_not_characters(small_app: pgqueue.App, db_dsn: str) -> None:
    # 70 characters, 140 bytes of UTF-8.
    assert_rejected(
        db_dsn, pgqueue.PayloadTooLarge, lambda: small_app.enqueue("t", {"a": "é" * 70})
    )


def test_payload_limit_is_per_job_in_enqueue_many(small_app: pgqueue.App, db_dsn: str) -> None:
    # Fifty small payloads are fine even though the batch is far over 100 bytes.
    results = small_app.enqueue_many([pgqueue.JobSpec("t", {"i": "x" * 50}) for _ in range(50)])
    assert len(results) == 50

    specs = [pgqueue.JobSpec("t", {"i": i}) for i in range(20)]
    specs[13] = pgqueue.JobSpec("t", {"big": "x" * 500})
    error = assert_rejected(db_dsn, pgqueue.PayloadTooLarge, lambda: small_app.enqueue_many(specs))
    assert "13" in str(error)  # names the culprit


def test_default_payload_limit_is_one_mebibyte(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t", {"a": "x" * (1024 * 1024 - 1024)})
    assert_rejected(
        db_dsn, pgqueue.PayloadTooLarge, lambda: app.enqueue("t", {"a": "x" * (1024 * 1024)})
    )


@pytest.mark.parametrize(
    "bad",
    [NOT_AN_OBJECT[0], NOT_SERIALISABLE[0], HOLDS_NUL[0], HOLDS_LONE_SURROGATE[0]],
    ids=["list", "opaque", "nul", "surrogate"],
)
def test_one_bad_payload_rejects_the_whole_batch(app: pgqueue.App, db_dsn: str, bad: Any) -> None:
    specs = [pgqueue.JobSpec("t", {"i": i}) for i in range(10)]
    specs.insert(5, pgqueue.JobSpec("t", bad))
    assert_rejected(db_dsn, pgqueue.InvalidPayload, lambda: app.enqueue_many(specs))


def test_enqueue_many_takes_job_specs_only(app: pgqueue.App, db_dsn: str) -> None:
    assert_rejected(
        db_dsn,
        pgqueue.InvalidOption,
        lambda: app.enqueue_many([pgqueue.JobSpec("t"), {"task": "t"}]),  # type: ignore[list-item]
    )
    assert_rejected(
        db_dsn,
        pgqueue.InvalidOption,
        lambda: app.enqueue_many(pgqueue.JobSpec("t")),  # type: ignore[arg-type]
    )


# Text PostgreSQL can store: no NUL, no lone surrogates.
storable_text = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    # Beyond 2**53 jsonb keeps the decimal text, which reads back as an int.
    | st.floats(min_value=-1e15, max_value=1e15)
    | st.text(storable_text),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(storable_text, max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(storable_text, max_size=12), json_values, max_size=6)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=payloads)
def test_any_json_object_round_trips(app: pgqueue.App, payload: dict[str, Any]) -> None:
    job_id = app.enqueue("t", payload).job_id
    assert app.get_job(job_id).payload == payload


# --- durations and times ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "delay", [-1, -0.001, timedelta(seconds=-5), math.nan, math.inf, "10"], ids=label
)
def test_bad_delay(app: pgqueue.App, db_dsn: str, delay: Any) -> None:
    assert_rejected(db_dsn, pgqueue.InvalidDuration, lambda: app.enqueue("t", delay=delay))


def test_negative_delay_through_with_options(app: pgqueue.App, db_dsn: str) -> None:
    @app.task
    def send() -> None: ...

    error = assert_rejected(
        db_dsn, pgqueue.InvalidDuration, lambda: send.with_options(delay=-30).enqueue()
    )
    assert "delay" in str(error)


def test_negative_delay_in_a_batch(app: pgqueue.App, db_dsn: str) -> None:
    specs = [pgqueue.JobSpec("t"), pgqueue.JobSpec("t", delay=-1)]
    assert_rejected(db_dsn, pgqueue.InvalidDuration, lambda: app.enqueue_many(specs))


def test_run_at_and_delay_together(app: pgqueue.App, db_dsn: str) -> None:
    assert_rejected(
        db_dsn,
        pgqueue.InvalidOption,
        lambda: app.enqueue("t", run_at=datetime.now(UTC), delay=5),
    )


@pytest.mark.parametrize("run_at", ["2030-01-01", 1700000000, datetime.now(UTC).date()], ids=label)
def test_run_at_that_is_not_a_datetime(app: pgqueue.App, db_dsn: str, run_at: Any) -> None:
    assert_rejected(db_dsn, pgqueue.InvalidOption, lambda: app.enqueue("t", run_at=run_at))


# --- names -------------------------------------------------------------------------------------


BAD_QUEUES: list[Any] = [
    "",
    " ",
    "a b",
    "mail\n",  # a `$` anchor would let the trailing newline through
    "é",
    "x" * 129,
    "a/b",
    5,
]
BAD_TASKS: list[Any] = ["", "   ", "a\x00b", "tab\there", "trailing\n", "x" * 256, 5]
BAD_SCHEMAS: list[Any] = [
    "",
    "Pgqueue",
    "1abc",
    "a-b",
    "pg queue",
    "x" * 49,
    'a"b',
    None,
    "pgqueue\n",
]


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=label)
def test_bad_queue_name(app: pgqueue.App, db_dsn: str, queue: Any) -> None:
    error = assert_rejected(db_dsn, pgqueue.InvalidName, lambda: app.enqueue("t", queue=queue))
    assert "queue" in str(error)


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=label)
def test_bad_queue_name_in_batch_and_replay(app: pgqueue.App, db_dsn: str, queue: Any) -> None:
    job_id = app.enqueue("t").job_id
    assert_rejected(
        db_dsn, pgqueue.InvalidName, lambda: app.enqueue_many([pgqueue.JobSpec("t", queue=queue)])
    )
    assert_rejected(db_dsn, pgqueue.InvalidName, lambda: app.replay(job_id, queue=queue))


LEASE_BAD_QUEUES: list[Any] = [
    *BAD_QUEUES,
    [""],
    ["ok", "not ok"],
]


@pytest.mark.parametrize("queue", LEASE_BAD_QUEUES, ids=label)
def test_bad_queue_name_in_lease(app: pgqueue.App, db_dsn: str, queue: Any) -> None:
    app.enqueue("t")
    assert_rejected(db_dsn, pgqueue.InvalidName, lambda: app.lease(queue, "w1"))


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=label)
def test_bad_queue_name_in_a_task_definition(app: pgqueue.App, queue: Any) -> None:
    with pytest.raises(pgqueue.InvalidName):

        @app.task(queue=queue)
        def send() -> None: ...

    assert app.tasks == {}


@pytest.mark.parametrize("task", BAD_TASKS, ids=label)
def test_bad_task_name(app: pgqueue.App, db_dsn: str, task: Any) -> None:
    error = assert_rejected(db_dsn, pgqueue.InvalidName, lambda: app.enqueue(task))
    assert "task" in str(error)
    assert_rejected(db_dsn, pgqueue.InvalidName, lambda: app.enqueue_many([pgqueue.JobSpec(task)]))


@pytest.mark.parametrize("schema", BAD_SCHEMAS, ids=label)
def test_bad_schema_name(db_dsn: str, schema: Any) -> None:
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.InvalidName, match="schema"):
        pgqueue.App(dsn=db_dsn, schema=schema)
    with pytest.raises(pgqueue.InvalidName, match="schema"):
        upgrade(db_dsn, schema=schema)
    assert snapshot(db_dsn) == before


# --- other options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 40_000},
        {"priority": -40_000},
        {"priority": 1.5},
        {"priority": "1"},
        {"priority": True},
        {"max_attempts": -1},
        {"max_attempts": -3},
        {"max_attempts": 2.0},
        {"dedup_key": ""},
        {"dedup_key": 5},
        {"dedup_key": "a\x00b"},
        {"dedup_key": "k" * 1025},
        {"serial_key": ""},
        {"serial_key": ["k"]},
    ],
    ids=label,
)
def test_bad_enqueue_option(app: pgqueue.App, db_dsn: str, options: dict[str, Any]) -> None:
    (name,) = options
    error = assert_rejected(db_dsn, pgqueue.InvalidOption, lambda: app.enqueue("t", **options))
    assert name in str(error)


def test_bad_consumer_arguments(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t")
    assert_rejected(db_dsn, pgqueue.InvalidOption, lambda: app.lease("default", "w1", max=0))
    assert_rejected(db_dsn, pgqueue.InvalidOption, lambda: app.lease("default", ""))
    assert_rejected(
        db_dsn, pgqueue.InvalidDuration, lambda: app.lease("default", "w1", lease_seconds=-1)
    )
    (leased,) = app.lease("default", "w1")
    assert_rejected(db_dsn, pgqueue.InvalidDuration, lambda: app.extend(leased, -5))
    assert_rejected(db_dsn, pgqueue.InvalidOption, lambda: app.fail(leased, 42))  # type: ignore[arg-type]
    assert_rejected(
        db_dsn,
        pgqueue.InvalidOption,
        lambda: app.fail(leased, "x", retry_at="tomorrow"),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("job_id", [0, -1, "1", 1.0, True], ids=label)
def test_bad_job_id(app: pgqueue.App, db_dsn: str, job_id: Any) -> None:
    calls: list[Callable[[Any], object]] = [
        app.get_job,
        app.cancel,
        app.replay,
        app.requeue_dead,
        app.explain,
    ]
    for call in calls:
        assert_rejected(db_dsn, pgqueue.InvalidOption, functools.partial(call, job_id))


def test_bad_app_options(db_dsn: str) -> None:
    with pytest.raises(pgqueue.InvalidOption):
        pgqueue.App(dsn=db_dsn, max_payload_bytes=0)
    with pytest.raises(pgqueue.InvalidOption):
        pgqueue.App(dsn=db_dsn, max_payload_bytes=-1)


# --- connection and schema problems --------------------------------------------------------


def use_unreachable_app(call: Callable[[pgqueue.App], object]) -> None:
    with pgqueue.App(dsn=UNREACHABLE_DSN) as unreachable:
        call(unreachable)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.enqueue("t"),
        lambda a: a.enqueue_many([pgqueue.JobSpec("t")]),
        lambda a: a.lease("default", "w1"),
        lambda a: a.get_job(1),
        lambda a: a.metrics(),
    ],
    ids=["enqueue", "enqueue_many", "lease", "get_job", "metrics"],
)
def test_unreachable_dsn_is_a_connection_error(call: Callable[[pgqueue.App], object]) -> None:
    with pytest.raises(pgqueue.ConnectionFailed) as caught:
        use_unreachable_app(call)
    assert "127.0.0.1" in str(caught.value)
    assert isinstance(caught.value, ConnectionError)


def test_unreachable_dsn_is_a_connection_error_async() -> None:
    async def main() -> None:
        async with pgqueue.App(dsn=UNREACHABLE_DSN) as unreachable:
            await unreachable.enqueue_async("t")

    with pytest.raises(pgqueue.ConnectionFailed):
        asyncio.run(main())


def test_missing_database_is_a_connection_error(pg_server_dsn: str) -> None:
    with (
        pytest.raises(pgqueue.ConnectionFailed),
        pgqueue.App(dsn=with_dbname(pg_server_dsn, "pgq_no_such_database")) as missing,
    ):
        missing.enqueue("t")


def test_malformed_dsn_is_a_connection_error() -> None:
    def use() -> None:
        with pgqueue.App(dsn="this is not a dsn") as malformed:
            malformed.enqueue("t")

    with pytest.raises(pgqueue.ConnectionFailed, match="DSN"):
        use()


def test_unknown_role_is_a_connection_error(pg_server_dsn: str, db_dsn: str) -> None:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(db_dsn)
    host = parts.netloc.rpartition("@")[2]
    bad_user = urlunsplit(parts._replace(netloc=f"pgq_no_such_role@{host}"))
    before = snapshot(db_dsn)
    with pgqueue.App(dsn=bad_user) as wrong, pytest.raises(pgqueue.ConnectionFailed):
        wrong.enqueue("t")
    assert snapshot(db_dsn) == before


def test_unmigrated_database_names_pgqueue_migrate(empty_db_dsn: str) -> None:
    def schemas() -> list[tuple[str]]:
        with psycopg.connect(empty_db_dsn) as conn:
            return conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%'"
                " AND nspname <> 'information_schema' ORDER BY 1"
            ).fetchall()

    before = schemas()
    with pgqueue.App(dsn=empty_db_dsn) as unmigrated:
        with pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"):
            unmigrated.enqueue("t", {"a": 1})
        with pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"):
            unmigrated.lease("default", "w1")
    assert schemas() == before == [("public",)]


def test_unmigrated_schema_names_pgqueue_migrate(db_dsn: str) -> None:
    before = snapshot(db_dsn)
    with (
        pgqueue.App(dsn=db_dsn, schema="elsewhere") as unmigrated,
        pytest.raises(pgqueue.SchemaNotMigrated) as caught,
    ):
        unmigrated.enqueue("t")
    # The command that fixes it, for this schema.
    assert re.search(r"pgqueue --schema[ =]elsewhere migrate", str(caught.value))
    assert snapshot(db_dsn) == before


def test_unmigrated_schema_async(empty_db_dsn: str) -> None:
    async def main() -> None:
        async with pgqueue.App(dsn=empty_db_dsn) as unmigrated:
            await unmigrated.enqueue_async("t")

    with pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"):
        asyncio.run(main())
