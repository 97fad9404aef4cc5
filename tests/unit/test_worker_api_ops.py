"""The ops of the HTTP API's SQL worker API and role lookups, driven with
canned rows: which named statement each yields, and what it makes of the
answer (the HTTP tests show the same against a real database)."""

from __future__ import annotations

from typing import Any

from pgqueue.ops import Execute, Op, roles, worker_api


def drive(op: Op[Any], *answers: Any) -> tuple[list[Execute], Any]:
    """Run ``op`` answering its steps in turn; the steps and the result."""
    steps: list[Execute] = []
    try:
        step = next(op)
        for answer in answers:
            assert isinstance(step, Execute)
            steps.append(step)
            step = op.send(answer)
    except StopIteration as stop:
        return steps, stop.value
    raise AssertionError(f"the op asked for more than {len(answers)} answers: {step}")


def test_ack_many_without_results_uses_ack_many() -> None:
    steps, held = drive(worker_api.ack_many([1, 2], [10, 20], [None, None]), [(2,)])
    assert [s.query for s in steps] == ["worker_api_ack_many"]
    assert held == {2}


def test_ack_many_with_a_result_fences_each_pair() -> None:
    steps, held = drive(worker_api.ack_many([1, 2], [10, 20], ['{"a": 1}', None]), [(1,), (2,)])
    assert [s.query for s in steps] == ["worker_api_ack_results"]
    assert dict(steps[0].params)["results"] == ['{"a": 1}', None]
    assert held == {1, 2}


def test_a_stale_attempt_is_told_apart() -> None:
    assert drive(worker_api.ack(1, 10, None), (False,))[1] is False
    assert drive(worker_api.nack(1, 10), (None,))[1] is False
    assert drive(worker_api.fail(1, 10, "boom", None, False), (None,))[1] is None
    assert drive(worker_api.fail(1, 10, "boom", None, False), ("queued",))[1] == "queued"
    assert drive(worker_api.extend(1, 10, 30), (False, "later"))[1] is None
    assert drive(worker_api.extend(1, 10, 30), (True, "later"))[1] == "later"
    assert drive(worker_api.job_state(1), None)[1] is None
    assert drive(worker_api.job_state(1), ("running", True))[1] == ("running", True)


def test_recorded_grants_reads_nothing_before_the_table_exists() -> None:
    steps, found = drive(roles.recorded_grants("pgqueue"), (False,))
    assert [s.query for s in steps] == ["role_grants_present"]
    assert found == {}
    steps, found = drive(roles.recorded_grants("pgqueue"), (True,), [("worker", "w")])
    assert [s.query for s in steps] == ["role_grants_present", "role_grants_latest"]
    assert found == {"worker": "w"}


def test_may_become_tells_a_missing_role() -> None:
    assert drive(roles.may_become("nobody"), None)[1] is None
    assert drive(roles.may_become("w"), (False,))[1] is False
