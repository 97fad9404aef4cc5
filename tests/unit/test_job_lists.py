"""The job lists of the CLI, the API and the dashboard are one family of
statements (``job_list``, ``job_list_finished``, ``job_list_window`` of
``sql/queries/inspect.sql``), driven here with canned rows: which statement
each filter reads, with which parameters, and how a search crosses its
windows of ids."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from pgqueue.ops import Execute, Op
from pgqueue.ops.inspect import (
    SEARCH_WINDOW,
    JobFilter,
    JobPage,
    decode_cursor,
    encode_cursor,
    job_page,
    list_jobs,
)
from pgqueue.queries import queries_for

FAMILY = {"job_list", "job_list_finished", "job_list_window"}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def job_row(job_id: int, status: str = "queued") -> dict[str, Any]:
    return {
        "id": job_id,
        "queue": "q",
        "task": "t",
        "payload": {},
        "priority": 0,
        "status": status,
        "run_at": T0,
        "attempts": 0,
        "max_attempts": 3,
        "dedup_key": None,
        "serial_key": None,
        "created_at": T0,
        "finished_at": T0 if status in ("succeeded", "dead", "cancelled") else None,
        "last_error": None,
        "result": None,
    }


def drive(op: Op[Any], answers: Iterator[Any]) -> tuple[list[Execute], Any]:
    """Run ``op``, answering its statements in turn; the statements and the result."""
    asked: list[Execute] = []
    try:
        step = next(op)
        while True:
            assert isinstance(step, Execute)
            asked.append(step)
            step = op.send(next(answers))
    except StopIteration as stop:
        return asked, stop.value


def statements_of(asked: list[Execute]) -> list[str]:
    return [a.query for a in asked]


def test_every_statement_of_the_family_takes_what_the_ops_pass() -> None:
    """The parameters each op passes are those its statement names (a
    parameter missing from either side fails at run time)."""
    text = queries_for("pgqueue")
    cases: list[tuple[Op[Any], list[Any]]] = [
        (list_jobs(status="queued", tags=["a"]), [[]]),
        (job_page(JobFilter(status="dead"), None, 10), [[]]),
        (job_page(JobFilter(q="x"), None, 10), [(1, 9, 9), []]),
    ]
    for op, answers in cases:
        asked, _ = drive(op, iter(answers))
        for step in asked:
            assert isinstance(step.params, dict)
            named = set(text[step.query].split("%(")[1:])
            names = {part.split(")s", 1)[0] for part in named}
            assert names == set(step.params), step.query


@pytest.mark.parametrize(
    ("flt", "answers", "expected"),
    [
        # list_jobs' filters (the tag filter is list_jobs itself) ...
        (JobFilter(status="queued"), [[]], ["job_list"]),
        (JobFilter(tag="vip", status="dead"), [[]], ["job_list"]),
        # ... a finished status in the order of its finish ...
        (JobFilter(status="succeeded", queue="q"), [[]], ["job_list_finished"]),
        # ... no filter: the newest ids (the window only when the page is short) ...
        (JobFilter(), [[job_row(i) for i in range(9, 0, -1)]], ["job_list"]),
        (JobFilter(), [[job_row(2)], (2, 2, 1)], ["job_list", "job_list_window"]),
        # ... text, or filters with no status: inside one window of ids.
        (JobFilter(q="needle"), [(1, 9, 9), []], ["job_list_window", "job_list"]),
        (JobFilter(queue="q"), [(1, 9, 9), []], ["job_list_window", "job_list"]),
    ],
)
def test_each_list_reads_one_of_the_job_list_statements(
    flt: JobFilter, answers: list[Any], expected: list[str]
) -> None:
    asked, page = drive(job_page(flt, None, 5), iter(answers))
    assert statements_of(asked) == expected
    assert set(statements_of(asked)) <= FAMILY
    assert isinstance(page, JobPage)


def test_list_jobs_reads_job_list_with_every_filter() -> None:
    asked, page = drive(
        list_jobs(
            "q", "scheduled", "t", limit=2, cursor=encode_cursor(40), tags=["a"], group_key="g"
        ),
        iter([[job_row(30), job_row(20), job_row(10)]]),
    )
    [step] = asked
    assert step.query == "job_list"
    assert step.params == {
        "queue": "q",
        "task": "t",
        "group_key": "g",
        "tags": ["a"],
        "stored_statuses": ["queued", "scheduled"],
        "stored_stages": ["queued", "scheduled"],
        "due": False,
        "pattern": None,
        "before_id": 40,
        "min_id": None,
        "limit": 3,
    }
    assert [j.id for j in page.jobs] == [30, 20]
    assert decode_cursor(page.next_cursor) == 20


def test_a_search_reads_only_its_window_and_goes_on_below_it() -> None:
    window = (1_001, 6_000, SEARCH_WINDOW)  # a full window: older jobs exist
    asked, page = drive(
        job_page(JobFilter(q="50%_off", status="dead"), encode_cursor(6_001), 5),
        iter([window, [job_row(5_000, "dead")]]),
    )
    assert statements_of(asked) == ["job_list_window", "job_list"]
    assert asked[0].params == {"before_id": 6_001, "window": SEARCH_WINDOW}
    params = asked[1].params
    assert isinstance(params, dict)
    assert (params["min_id"], params["before_id"]) == (1_001, 6_001)
    assert params["pattern"] == "%50\\%\\_off%"  # wildcards are literal
    assert params["stored_statuses"] == ["dead"]
    # A short page: the next one starts below the window, which it names.
    assert page.searched_to_id == 1_001
    assert decode_cursor(page.next_cursor) == 1_001


def test_a_search_ends_where_the_jobs_end() -> None:
    asked, page = drive(job_page(JobFilter(q="x"), None, 5), iter([(1, 300, 300), [job_row(7)]]))
    assert [j.id for j in page.jobs] == [7]
    assert page.next_cursor is None
    assert page.searched_to_id == 1
    # Below the cursor nothing at all: no list is read.
    asked, page = drive(job_page(JobFilter(q="x"), encode_cursor(1), 5), iter([(None, None, 0)]))
    assert statements_of(asked) == ["job_list_window"]
    assert page == JobPage([], None, None)


def test_a_finished_list_continues_from_its_last_finish() -> None:
    rows = [job_row(i, "dead") for i in (9, 8, 7)]
    asked, page = drive(job_page(JobFilter(status="dead"), None, 2), iter([rows]))
    assert [j.id for j in page.jobs] == [9, 8]
    asked, _ = drive(job_page(JobFilter(status="dead"), page.next_cursor, 2), iter([[]]))
    params = asked[0].params
    assert isinstance(params, dict)
    assert (params["before_finished"], params["before_id"]) == (T0, 8)
