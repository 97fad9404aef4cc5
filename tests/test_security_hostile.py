"""Hostile input through the Python API, the SQL function and the CLI.

Every value either gets a clear pgqueue error (an ``InvalidInput`` subclass,
or a ``pgqueue:`` message with SQLSTATE 22023 from the SQL function, or one
``error:`` line from the CLI) and writes nothing, or is stored verbatim and
read back identically. Never a raw driver or SQL error, never a partial write.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.cron import Cron
from pgqueue.payloads import MAX_PAYLOAD_DEPTH
from tests.apps import hostile
from tests.cli_support import assert_one_line_error, clean_env, invoke, run_cli, script
from tests.fixtures.cluster import (
    ThrowawayCluster,
    create_database,
    drop_database,
    unique_db_name,
)
from tests.fixtures.dbstate import Listener, snapshot
from tests.fixtures.workers import Workers

NOTIFY_LIMIT = 8000  # bytes: PostgreSQL refuses a longer NOTIFY payload


@pytest.fixture(scope="module")
def shared_dsn(
    pg_server_dsn: str, template_db: str, clone_strategy: Literal["FILE_COPY"] | None
) -> Iterator[str]:
    """One database for the module (per xdist worker): every rejection test
    compares the whole database before and after its own call."""
    name = unique_db_name("pgq_hostile")
    dsn = create_database(pg_server_dsn, name, template=template_db, strategy=clone_strategy)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)


@pytest.fixture(scope="module")
def shared_app(shared_dsn: str) -> Iterator[pgqueue.App]:
    with pgqueue.App(shared_dsn) as module_app:
        yield module_app


def rejected(dsn: str, error: type[BaseException], call: Callable[[], object]) -> str:
    """``call`` raises ``error`` and the database is unchanged; returns the message."""
    before = snapshot(dsn)
    with pytest.raises(error) as caught:
        call()
    assert snapshot(dsn) == before
    return str(caught.value)


def nested(depth: int, kind: Literal["object", "array"] = "object") -> Any:
    """A JSON value nesting ``depth`` objects (or arrays), built without recursion."""
    value: Any = {} if kind == "object" else []
    for _ in range(depth - 1):
        value = {"a": value} if kind == "object" else [value]
    return value


def nested_text(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


# Strings that break naive SQL, shell or format-string handling, and text
# that is valid but unusual: all must be stored and read back verbatim.
TRICKY = [
    "'",
    '"',
    "'; DROP TABLE pgqueue.jobs; --",
    'Robert"); DROP TABLE pgqueue.jobs;--',
    "\\",
    "\\x00",
    "$$ SELECT 1 $$",
    "%s %(name)s {schema} {channel} {}",
    "e\u0301 \u202e RTL \u200b zero-width \ufeff BOM",
    "\U0001f600 \U0001f4a9 \u4e2d\u6587",
    " leading and trailing ",
    "semi;colon",
    "new\u2028line",
]


# --- the Python API: stored verbatim ----------------------------------------------------


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_round_trips_through_the_python_api(shared_app: pgqueue.App, text: str) -> None:
    payload = {text: text, "nested": [text, {"k": text}]}
    first = shared_app.enqueue(text, payload, queue="tricky", dedup_key=text, serial_key=text)
    again = shared_app.enqueue(text, payload, queue="tricky", dedup_key=text)
    assert again == pgqueue.Enqueued(first.job_id, False)  # the dedup key works as a key

    job = shared_app.get_job(first.job_id)
    assert (job.task, job.payload, job.dedup_key, job.serial_key) == (text, payload, text, text)
    assert [j.id for j in shared_app.list_jobs(queue="tricky", task=text).jobs] == [first.job_id]
    (leased,) = shared_app.lease("tricky", f"worker {text}")
    assert (leased.task, leased.payload) == (text, payload)
    shared_app.ack(leased, {"echo": text})
    assert shared_app.result(first.job_id, timeout=5) == {"echo": text}


def test_longest_names_and_keys_round_trip(shared_app: pgqueue.App) -> None:
    task = "t" * 255
    four_byte_key = "\U0001f600" * 256  # 1024 bytes: the btree index takes it
    ascii_key = "k" * 1024
    for key in (four_byte_key, ascii_key):
        job_id = shared_app.enqueue(task, queue="q" * 128, dedup_key=key, serial_key=key).job_id
        job = shared_app.get_job(job_id)
        assert (job.task, job.queue, job.dedup_key, job.serial_key) == (
            task,
            "q" * 128,
            key,
            key,
        )


def test_a_large_string_payload_round_trips(shared_app: pgqueue.App) -> None:
    # 100,000 x 8 bytes of JSON (two-byte letter, escaped quote and backslash):
    # under the default 1 MiB limit.
    payload = {"blob": "\u00e9'\";\\" * 100_000}
    job_id = shared_app.enqueue("t", payload).job_id
    assert shared_app.get_job(job_id).payload == payload


storable_char = st.characters(exclude_categories=["Cs", "Cc"])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    task=st.text(storable_char, min_size=1, max_size=40).filter(str.strip),
    key=st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
        min_size=1,
        max_size=256,  # at most 1024 bytes of UTF-8
    ),
)
def test_any_storable_task_name_and_key_round_trips(
    shared_app: pgqueue.App, task: str, key: str
) -> None:
    job_id = shared_app.enqueue(task, {key: key}, queue="fuzz", dedup_key=key).job_id
    job = shared_app.get_job(job_id)
    assert (job.task, job.payload, job.dedup_key) == (task, {key: key}, key)
    shared_app.cancel(job_id)  # frees the dedup key for the next example


# --- the Python API: refused, nothing written --------------------------------------------

LONE_SURROGATE = "bad \udc80 bytes"  # what os.fsdecode makes of b"bad \x80 bytes"


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda a: a.enqueue(LONE_SURROGATE), pgqueue.InvalidName, "not valid Unicode"),
        (lambda a: a.enqueue("t", dedup_key=LONE_SURROGATE), pgqueue.InvalidOption, "Unicode"),
        (lambda a: a.enqueue("t", serial_key=LONE_SURROGATE), pgqueue.InvalidOption, "Unicode"),
        (lambda a: a.enqueue("t", {"a": LONE_SURROGATE}), pgqueue.InvalidPayload, "Unicode"),
        (lambda a: a.enqueue("t", {LONE_SURROGATE: 1}), pgqueue.InvalidPayload, "Unicode"),
        (lambda a: a.enqueue("t", queue=LONE_SURROGATE), pgqueue.InvalidName, "queue name"),
        (lambda a: a.enqueue("t\x00"), pgqueue.InvalidName, "control"),
        (lambda a: a.enqueue("t", dedup_key="k\x00"), pgqueue.InvalidOption, "NUL"),
        (lambda a: a.enqueue("t", serial_key="k\x00"), pgqueue.InvalidOption, "NUL"),
        (lambda a: a.enqueue("t", {"a": "\x00"}), pgqueue.InvalidPayload, "NUL"),
        (lambda a: a.enqueue("t" * 256), pgqueue.InvalidName, "255"),
        (lambda a: a.enqueue("t", dedup_key="k" * 1025), pgqueue.InvalidOption, "1024 bytes"),
        (
            lambda a: a.enqueue("t", dedup_key="\U0001f600" * 257),
            pgqueue.InvalidOption,
            "1024 bytes",
        ),
        (
            lambda a: a.enqueue("t", serial_key="\u4e2d" * 342),
            pgqueue.InvalidOption,
            "1024 bytes",
        ),
        (lambda a: a.enqueue("t", queue="q" * 129), pgqueue.InvalidName, "1-128"),
        (lambda a: a.enqueue("t", queue="a'; DROP TABLE x;--"), pgqueue.InvalidName, "queue"),
        (lambda a: a.list_jobs(task=LONE_SURROGATE), pgqueue.InvalidName, "Unicode"),
        (lambda a: a.lease("default", "w\x00"), pgqueue.InvalidOption, "worker_id"),
        (lambda a: a.lease("default", LONE_SURROGATE), pgqueue.InvalidOption, "worker_id"),
        (
            lambda a: a.add_schedule(LONE_SURROGATE, "* * * * *", "t"),
            pgqueue.InvalidName,
            "Unicode",
        ),
        (
            lambda a: a.add_schedule("s", "* * * * *", LONE_SURROGATE),
            pgqueue.InvalidName,
            "Unicode",
        ),
        (lambda a: a.add_schedule("s" * 256, "* * * * *", "t"), pgqueue.InvalidName, "255"),
        (lambda a: a.add_schedule("s\x00", "* * * * *", "t"), pgqueue.InvalidName, "control"),
        (
            lambda a: a.add_schedule("s", "* * * * *", "t", timezone="../../etc/passwd"),
            pgqueue.InvalidTimezone,
            "time zone",
        ),
        (
            lambda a: a.add_schedule("s", "* * * * *", "t", timezone=LONE_SURROGATE),
            pgqueue.InvalidTimezone,
            "time zone",
        ),
        (lambda a: a.add_schedule("s", "* * * * *\x00", "t"), pgqueue.InvalidCron, "cron"),
        (lambda a: a.set_queue_limit("default", rate="1\x00/1m"), pgqueue.InvalidOption, "rate"),
    ],
)
def test_hostile_values_get_a_clear_error_and_write_nothing(
    shared_app: pgqueue.App,
    shared_dsn: str,
    call: Callable[[pgqueue.App], object],
    error: type[BaseException],
    fragment: str,
) -> None:
    assert fragment in rejected(shared_dsn, error, lambda: call(shared_app))


@pytest.mark.parametrize(
    "schema",
    [
        'x"; DROP SCHEMA pgqueue CASCADE; --',
        "Robert'); DROP TABLE jobs;--",
        "pg_catalog; select",
        "UPPER",
        "s" * 49,
        "sch\u00e9ma",
        "a\x00b",
        LONE_SURROGATE,
        "",
    ],
)
def test_hostile_schema_names(shared_dsn: str, schema: str) -> None:
    from pgqueue.grants import grant
    from pgqueue.migrate import upgrade

    namespaces = "SELECT array_agg(nspname ORDER BY nspname) FROM pg_namespace"
    with psycopg.connect(shared_dsn, autocommit=True) as conn:
        before = conn.execute(namespaces).fetchone()
    for call in (
        lambda: pgqueue.App(shared_dsn, schema=schema),
        lambda: upgrade(shared_dsn, schema),
        lambda: grant("postgres", "producer", dsn=shared_dsn, schema=schema),
    ):
        rejected(shared_dsn, pgqueue.InvalidName, call)
    assert_one_line_error(invoke(shared_dsn, "--schema", schema, "status"), "schema name")
    with psycopg.connect(shared_dsn, autocommit=True) as conn:
        assert conn.execute(namespaces).fetchone() == before


# --- deeply nested JSON -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["object", "array"])
def test_nesting_up_to_the_limit_round_trips(
    shared_app: pgqueue.App, kind: Literal["object", "array"]
) -> None:
    payload = {"deep": nested(MAX_PAYLOAD_DEPTH - 1, kind)}  # the payload itself is one level
    job_id = shared_app.enqueue("t", payload, queue="deep").job_id
    assert shared_app.get_job(job_id).payload == payload
    (leased,) = shared_app.lease("deep", "w1")
    assert leased.payload == payload
    shared_app.ack(leased)


@pytest.mark.parametrize("depth", [MAX_PAYLOAD_DEPTH + 1, 900, 10_000])
@pytest.mark.parametrize("kind", ["object", "array"])
def test_deeper_payloads_are_invalid(
    shared_app: pgqueue.App, shared_dsn: str, depth: int, kind: Literal["object", "array"]
) -> None:
    payload = {"deep": nested(depth, kind)}
    message = rejected(shared_dsn, pgqueue.InvalidPayload, lambda: shared_app.enqueue("t", payload))
    assert f"deeper than {MAX_PAYLOAD_DEPTH} levels" in message
    batch = [pgqueue.JobSpec("t", {"ok": 1}), pgqueue.JobSpec("t", payload)]
    message = rejected(shared_dsn, pgqueue.InvalidPayload, lambda: shared_app.enqueue_many(batch))
    assert "job #1" in message


def test_deep_payload_with_a_raised_recursion_limit(
    shared_app: pgqueue.App, shared_dsn: str
) -> None:
    # An application may raise the limit: json then encodes 50,000 levels,
    # which PostgreSQL's parser refuses (stack depth limit exceeded); the
    # depth check must come first, with pgqueue's own error.
    payload = {"deep": nested(50_000)}
    limit = sys.getrecursionlimit()
    done: list[BaseException] = []

    def run() -> None:  # a thread with a large stack, as such an application would need
        sys.setrecursionlimit(200_000)
        try:
            shared_app.enqueue("t", payload)
        except BaseException as exc:
            done.append(exc)

    threading.stack_size(512 * 1024 * 1024)
    try:
        before = snapshot(shared_dsn)
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(0)
        sys.setrecursionlimit(limit)
    assert len(done) == 1
    assert isinstance(done[0], pgqueue.InvalidPayload), done
    assert snapshot(shared_dsn) == before


def test_an_over_deep_result_is_not_stored(shared_app: pgqueue.App) -> None:
    # A result too deep to read back later is refused by the low-level ack,
    # which writes nothing (the worker stores no result and says why instead:
    # tests/test_results_encoding.py).
    job_id = shared_app.enqueue("t", queue="deep-result").job_id
    (leased,) = shared_app.lease("deep-result", "w1")
    with pytest.raises(pgqueue.InvalidPayload, match="deeper"):
        shared_app.ack(leased, nested(MAX_PAYLOAD_DEPTH + 1))
    job = shared_app.get_job(job_id)
    assert (job.status, job.result) == (pgqueue.JobStatus.RUNNING, None)


# --- the SQL function ---------------------------------------------------------------------


def sql_enqueue(dsn: str, call: str, params: Any = None) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT {}").format(sql.SQL(call)), params).fetchone()
    assert row is not None
    job_id: int = row[0]
    return job_id


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_round_trips_through_the_sql_function(
    shared_app: pgqueue.App, shared_dsn: str, text: str
) -> None:
    payload = {text: [text]}
    job_id = sql_enqueue(
        shared_dsn,
        "pgqueue.enqueue(%(t)s, %(p)s, queue => 'sql-tricky', dedup_key => %(t)s,"
        " serial_key => %(t)s)",
        {"t": text, "p": psycopg.types.json.Jsonb(payload)},
    )
    again = sql_enqueue(
        shared_dsn,
        "pgqueue.enqueue(%(t)s, queue => 'sql-tricky', dedup_key => %(t)s)",
        {"t": text},
    )
    assert again == job_id
    job = shared_app.get_job(job_id)
    assert (job.task, job.payload, job.dedup_key, job.serial_key) == (text, payload, text, text)
    shared_app.cancel(job_id)


@pytest.mark.parametrize(
    ("call", "params", "named"),
    [
        ("pgqueue.enqueue('t', %s::jsonb)", (nested_text(MAX_PAYLOAD_DEPTH + 1),), "nested"),
        ("pgqueue.enqueue('t', %s::jsonb)", (nested_text(10_000),), "nested"),
        (
            "pgqueue.enqueue('t', jsonb_build_object('a', %s::jsonb))",
            (json.dumps(nested(MAX_PAYLOAD_DEPTH, "array")),),
            "nested",
        ),
        ("pgqueue.enqueue('t', dedup_key => %s)", ("k" * 1025,), "1024 bytes"),
        ("pgqueue.enqueue('t', serial_key => %s)", ("\U0001f600" * 257,), "1024 bytes"),
        ("pgqueue.enqueue('t', dedup_key => %s)", ("\U0001f600" * 100_000,), "1024 bytes"),
        ("pgqueue.enqueue(%s)", ("t" * 256,), "task"),
        ("pgqueue.enqueue(%s)", ("a\u0001b",), "task"),
        ("pgqueue.enqueue('t', queue => %s)", ("q" * 100_000,), "queue"),
        ("pgqueue.enqueue('t', queue => %s)", ("a'; DROP TABLE pgqueue.jobs; --",), "queue"),
        ("pgqueue.enqueue('t', queue => %s)", ("\u00e9",), "queue"),
        ("pgqueue.enqueue('t', dedup_key => '')", None, "dedup_key"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_hostile_sql_arguments_are_refused_clearly(
    shared_dsn: str, call: str, params: Any, named: str
) -> None:
    before = snapshot(shared_dsn)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        sql_enqueue(shared_dsn, call, params)
    message = caught.value.diag.message_primary or ""
    assert message.startswith("pgqueue:")
    assert named in message
    assert len(message) < 300  # a huge argument is not echoed back whole
    assert snapshot(shared_dsn) == before


def test_nesting_up_to_the_limit_through_the_sql_function(
    shared_app: pgqueue.App, shared_dsn: str
) -> None:
    job_id = sql_enqueue(
        shared_dsn, "pgqueue.enqueue('t', %s::jsonb)", (nested_text(MAX_PAYLOAD_DEPTH),)
    )
    assert shared_app.get_job(job_id).payload == nested(MAX_PAYLOAD_DEPTH)  # readable in Python
    shared_app.cancel(job_id)


def test_a_literal_too_deep_for_postgres_fails_in_the_callers_statement(shared_dsn: str) -> None:
    # PostgreSQL's own JSON parser gives up first (before pgqueue.enqueue is
    # called): the caller's statement fails, and nothing is written.
    before = snapshot(shared_dsn)
    with pytest.raises(psycopg.errors.StatementTooComplex):
        sql_enqueue(shared_dsn, "pgqueue.enqueue('t', %s::jsonb)", (nested_text(100_000),))
    assert snapshot(shared_dsn) == before


# --- the CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_round_trips_through_the_cli(
    shared_app: pgqueue.App, shared_dsn: str, text: str
) -> None:
    payload = {"value": text, text: 1}
    done = run_cli(
        shared_dsn,
        "enqueue", text,
        "--payload", json.dumps(payload),
        "--queue", "cli-tricky",
        "--dedup-key", text,
        "--serial-key", text,
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    job = shared_app.get_job(job_id)
    assert (job.task, job.payload, job.dedup_key, job.serial_key) == (text, payload, text, text)
    shown = run_cli(shared_dsn, "jobs", "show", str(job_id), "--json")
    assert json.loads(shown.stdout)["payload"] == payload
    shared_app.cancel(job_id)


def run_bytes(dsn: str, *args: str | bytes) -> subprocess.CompletedProcess[str]:
    """The console script with raw (possibly non-UTF-8) argument bytes."""
    done = subprocess.run(
        [script(), "--dsn", dsn, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((b"t\xff\xfe",), "not valid Unicode"),
        ((b"t", b"--queue", b"q\xff"), "invalid queue name"),
        ((b"t", b"--dedup-key", b"k\xc3"), "dedup_key is not valid Unicode"),
        ((b"t", b"--serial-key", b"\xed\xa0\x80"), "serial_key is not valid Unicode"),
        ((b"t", b"--payload", b'{"a": "\xff"}'), "not valid Unicode"),
        ((b"t", b"--payload", b'{"a": "\\u0000"}'), "NUL"),
        ((b"t", b"--payload", b'{"a": "\\ud800"}'), "not valid Unicode"),
        ((b"t", b"--payload", b"{'a': 1}; DROP TABLE pgqueue.jobs"), "not valid JSON"),
        ((b"t", b"--payload", nested_text(10_000).encode()), "too deeply"),
        ((b"t", b"--payload", nested_text(MAX_PAYLOAD_DEPTH + 1).encode()), "deeper than"),
        ((b"t", b"--dedup-key", b"k" * 1025), "1024 bytes"),
        ((b"t" * 256,), "255"),
        ((b"t", b"--queue", b"q" * 129), "1-128"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_hostile_cli_arguments(shared_dsn: str, args: tuple[bytes, ...], fragment: str) -> None:
    before = snapshot(shared_dsn)
    assert_one_line_error(run_bytes(shared_dsn, "enqueue", *args), fragment)
    assert snapshot(shared_dsn) == before


def test_hostile_payload_files_and_batches(shared_dsn: str, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(nested_text(100_000))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"a": "\xff\xfe"}')
    before = snapshot(shared_dsn)
    assert_one_line_error(
        run_cli(shared_dsn, "enqueue", "t", "--payload-file", str(deep)), "too deeply"
    )
    assert_one_line_error(
        run_cli(shared_dsn, "enqueue", "t", "--payload-file", str(binary)), "not UTF-8"
    )
    lines = '{"n": 1}\n' + nested_text(20_000) + "\n"
    assert_one_line_error(
        run_cli(shared_dsn, "enqueue", "t", "--batch", input=lines), "line 2", "too deeply"
    )
    assert snapshot(shared_dsn) == before


# --- task errors the database cannot store as they are ------------------------------------


def test_error_text_with_nul_and_surrogates_is_stored_escaped(shared_app: pgqueue.App) -> None:
    ids = [shared_app.enqueue("t", queue="bad-errors", max_attempts=1).job_id for _ in range(3)]
    first, second, third = shared_app.lease("bad-errors", "w1", max=3)
    message = hostile.HOSTILE_MESSAGE
    with pytest.raises(hostile.HostileError) as raised:
        raise hostile.HostileError(message)  # an exception with a traceback
    assert shared_app.fail(first, raised.value) is pgqueue.JobStatus.DEAD
    assert shared_app.fail(second, message) is pgqueue.JobStatus.DEAD
    shared_app.ack(third)
    stored = shared_app.get_job(ids[0], history=True)
    assert stored.attempt_history is not None
    attempt = stored.attempt_history[-1]
    assert attempt.error_message == message.replace("\x00", "\\x00").replace("\udc80", "\\udc80")
    assert attempt.traceback is not None
    assert "HostileError" in attempt.traceback
    assert "\\x00" in (shared_app.get_job(ids[1]).last_error or "")


def test_a_worker_records_hostile_errors_and_the_rest_of_its_batch(
    db_dsn: str, workers: Workers
) -> None:
    with pgqueue.App(db_dsn) as app:
        ids = [
            app.enqueue("raise_hostile", queue="hostile", max_attempts=1).job_id,
            app.enqueue("retry_hostile", queue="hostile", max_attempts=2).job_id,
            *(app.enqueue("fine", {"n": n}, queue="hostile").job_id for n in range(5)),
        ]
        worker = workers.spawn("--concurrency", "8", app="tests.apps.hostile:app")
        statuses = workers.wait_statuses(ids, timeout=60)
        assert [statuses[i] for i in ids] == ["dead"] * 2 + ["succeeded"] * 5
        for job_id in ids[:2]:
            history = app.get_job(job_id, history=True).attempt_history
            assert history is not None
            assert "nul \\x00 here; surrogate \\udc80 there" in (history[-1].error_message or "")
    assert worker.alive()


# --- cron strings from a fuzzer -------------------------------------------------------------

CRON_TOKENS = st.sampled_from(
    ["*", "*/5", "0", "59", "60", "1-5", "5-1", "1,2,3", "L", "W", "15W", "#", "1#2", "?",
     "JAN", "mon-fri", "SUN", "@daily", "@reboot", "-", "/", ",", "*/0", "99999999999999",
     "-1", "0x1F", "\u0661", "\x00", "\udc80", "';--", "R", "H"]
)  # fmt: skip
# Mostly plausible fields (values may be out of range), so valid expressions come up too.
CRON_FIELD = st.one_of(
    st.just("*"),
    st.integers(0, 61).map(str),
    st.tuples(st.integers(0, 60), st.integers(0, 60)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.integers(0, 70).map(lambda n: f"*/{n}"),
    st.lists(st.integers(0, 60), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v))),
)
CRON_TEXT = st.one_of(
    st.lists(CRON_FIELD, min_size=5, max_size=6).map(" ".join),
    st.text(max_size=40),
    st.lists(CRON_TOKENS, min_size=0, max_size=7).map(" ".join),
    st.lists(
        st.one_of(CRON_TOKENS, st.from_regex(r"[0-9*/,\-LW#?]{1,8}", fullmatch=True)),
        min_size=5,
        max_size=6,
    ).map(" ".join),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(expression=CRON_TEXT, timezone=st.sampled_from(["UTC", "Europe/Berlin", "Nowhere/X"]))
def test_fuzzed_cron_is_valid_or_invalid_cron(expression: str, timezone: str) -> None:
    try:
        cron = Cron.parse(expression, timezone)
    except (pgqueue.InvalidCron, pgqueue.InvalidTimezone):
        return
    now = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    following = cron.next_after(now)
    assert following > now
    assert following.tzinfo is not None
    assert cron.latest_between(now, now + timedelta(days=2)) >= now


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(expression=CRON_TEXT)
def test_fuzzed_cron_through_add_schedule(
    shared_app: pgqueue.App, shared_dsn: str, expression: str
) -> None:
    before = snapshot(shared_dsn)
    try:
        schedule = shared_app.add_schedule("fuzzed", expression, "t")
    except pgqueue.InvalidCron:
        assert snapshot(shared_dsn) == before
        return
    assert schedule.next_fire_at is not None
    shared_app.remove_schedule("fuzzed")


# --- wrong credentials ----------------------------------------------------------------------


@pytest.fixture
def password_cluster(cluster: ThrowawayCluster) -> tuple[ThrowawayCluster, str]:
    """The private cluster with a role that must give its password (scram)."""
    role, password = "pgq_pw_role", "right-password"
    dsn = cluster.fresh_db_dsn()
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        hba = Path(su.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
        # First match wins: this role authenticates by password, over TCP and socket.
        hba.write_text(
            f"host all {role} 127.0.0.1/32 scram-sha-256\n"
            f"local all {role} scram-sha-256\n" + hba.read_text()
        )
        su.execute("SELECT pg_reload_conf()")
    return cluster, make_conninfo(dsn, user=role)


def test_wrong_password_is_a_connection_error(
    password_cluster: tuple[ThrowawayCluster, str],
) -> None:
    _, dsn = password_cluster
    psycopg.connect(make_conninfo(dsn, password="right-password")).close()
    for wrong in (make_conninfo(dsn, password="wrong"), dsn):
        with pgqueue.App(wrong) as app, pytest.raises(pgqueue.ConnectionFailed) as caught:
            app.enqueue("t")
        message = str(caught.value)
        assert "password authentication failed" in message or "password" in message
        assert "wrong" not in message  # the password is never echoed
        assert "Traceback" not in message

    done = run_cli(make_conninfo(dsn, password="wrong-secret"), "enqueue", "t")
    assert_one_line_error(done, "password authentication failed")
    assert "wrong-secret" not in done.stderr


def test_unknown_role_and_database_through_the_console_script(pg_server_dsn: str) -> None:
    for dsn, fragment in (
        (make_conninfo(pg_server_dsn, user="pgq_nobody_at_all"), "pgq_nobody_at_all"),
        (make_conninfo(pg_server_dsn, dbname="pgq_no_such_db"), "pgq_no_such_db"),
    ):
        done = run_cli(dsn, "status")
        assert_one_line_error(done, "PostgreSQL at", fragment)


# --- NOTIFY payloads ----------------------------------------------------------------------

NOTIFY_FORMATS = {  # see pgqueue/events.py
    "j": re.compile(r"j:[A-Za-z0-9_.:-]{1,128}(#[0-9]+)?"),
    "w": re.compile(r"w:[A-Za-z0-9_.:-]{1,128}"),
    "p": re.compile(r"p:[A-Za-z0-9_.:-]{1,128}"),
    "r": re.compile(r"r:[A-Za-z0-9_.:-]{1,128}"),
    "q": re.compile(r"q:[A-Za-z0-9_.:-]{1,128}"),
    "c": re.compile(r"c:[0-9]+"),
    "f": re.compile(r"f:[0-9]+:(succeeded|dead|cancelled):[A-Za-z0-9_.:-]{1,128}"),
    "s": re.compile(r"s:[^\x00-\x1f]{1,255}", re.DOTALL),
}


def test_notify_payloads_stay_far_below_the_limit(app: pgqueue.App, listener: Listener) -> None:
    queue = "Q" * 128  # the longest queue name
    schedule = "\U0001f600" * 255  # the longest schedule name, in 4-byte characters

    app.enqueue("t", queue=queue)  # j:
    app.pause_queue(queue)  # p:
    app.resume_queue(queue)  # r:
    app.add_schedule(schedule, "* * * * *", "t")  # s:
    (leased,) = app.lease(None, "w1")  # a paused queue would not lease; resumed above
    app.cancel(leased.job_id)  # c: (running: its worker is told)
    waiter = app.enqueue("t", queue=queue).job_id
    with pytest.raises(pgqueue.ResultTimeout):
        app.result(waiter, timeout=0.01)  # asks to be told when it finishes...
    app.cancel(waiter)  # f: ...which cancelling does

    payloads = listener.drain()
    kinds = {p.split(":", 1)[0] for p in payloads}
    assert kinds >= {"j", "p", "r", "c", "f", "s"}
    for payload in payloads:
        assert NOTIFY_FORMATS[payload[0]].fullmatch(payload), payload
        assert len(payload.encode("utf-8")) <= 2 + 255 * 4 < NOTIFY_LIMIT
    assert max(len(p.encode("utf-8")) for p in payloads) == 2 + 255 * 4


def test_names_that_could_overflow_a_notification_are_refused(app: pgqueue.App) -> None:
    for call in (
        lambda: app.enqueue("t", queue="q" * NOTIFY_LIMIT),
        lambda: app.pause_queue("q" * 129),
        lambda: app.replay(1, queue="q" * 129),
        lambda: app.add_schedule("s" * 256, "* * * * *", "t"),
    ):
        with pytest.raises(pgqueue.InvalidName):
            call()
