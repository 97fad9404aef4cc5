"""The chaos checks catch what they claim to: each planted violation is reported.

A checker that never fails proves nothing; these cases feed it a clean
history, then the same history with one thing broken.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.chaos.invariants import AttemptRow, Effect, JobRow, check

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def clean() -> tuple[list[JobRow], list[AttemptRow], list[Effect]]:
    """Job 1 (key 0): attempt 10 reaped while its run went on, attempt 11
    released by a shutdown, attempt 12 succeeded. Job 2 (key 1): dead after
    a Permanent error on its first attempt."""
    jobs = [
        JobRow(1, 0, "chaos_work", "succeeded", 2, 5, 12, at(6), at(7), "w3"),
        JobRow(2, 1, "chaos_work", "dead", 1, 5, 13, at(1), at(2), "w1"),
    ]
    attempts = [
        AttemptRow(10, 1, 1, "lease_expired", at(0), at(3), "w1", "lease_expired"),
        AttemptRow(11, 1, 2, "released", at(4), at(5), "w2"),
        AttemptRow(13, 2, 1, "failed", at(1), at(2), "w1", "Permanent"),
    ]
    effects = [
        Effect(1, 10, 1, 101, "oversleep", at(0.1), at(3.5)),  # outlived its lease
        Effect(1, 11, 2, 102, "ok", at(4.1), None),  # cut short
        Effect(1, 12, 2, 103, "ok", at(6.1), at(6.5)),
        Effect(2, 13, 1, 101, "permanent", at(1.1), at(1.2)),
    ]
    return jobs, attempts, effects


@pytest.mark.chaos
def test_a_clean_history_passes() -> None:
    report = check(*clean(), expected_keys=[0, 1])
    assert report.violations == []
    assert report.stats["runs_outliving_their_lease"] == 1
    assert report.stats["runs_cut_short"] == 1


def broken(case: str) -> tuple[list[JobRow], list[AttemptRow], list[Effect], list[int]]:
    jobs, attempts, effects = clean()
    keys = [0, 1]
    if case == "a job is still running":
        jobs[1] = replace(jobs[1], status="running")
    elif case == "a job is missing":
        keys.append(2)
    elif case == "a gap in the attempt numbers":
        attempts[0] = replace(attempts[0], attempt=2)
    elif case == "attempts miscounted":
        jobs[0] = replace(jobs[0], attempts=3)
    elif case == "two attempts overlap":
        attempts[1] = replace(attempts[1], started_at=at(2.5))
    elif case == "a stale ack was accepted":
        # The reaped attempt 10's holder acked after attempt 12 existed.
        jobs[0] = replace(jobs[0], attempt_id=10)
    elif case == "a dead job's newest attempt is not the one recorded":
        jobs[1] = replace(jobs[1], attempt_id=9)
    elif case == "dead with attempts left":
        attempts[2] = replace(attempts[2], error_code="ValueError")
    elif case == "a succeeded job without its side effect":
        effects.pop(2)
    elif case == "acked before its run ended":
        effects[2] = replace(effects[2], ended_at=at(7.5))
    elif case == "a run without a lease":
        effects.append(Effect(1, 99, 1, 104, "ok", at(0.5), at(0.6)))
    elif case == "a run before its lease":
        effects[0] = replace(effects[0], started_at=at(-1))
    elif case == "an attempt ran in two processes":
        effects.append(Effect(1, 12, 2, 105, "ok", at(6.2), at(6.4)))
    elif case == "succeeded by a failing run":
        effects[2] = replace(effects[2], behaviour="raise")
    else:  # pragma: no cover
        raise AssertionError(case)
    return jobs, attempts, effects, keys


@pytest.mark.chaos
@pytest.mark.parametrize(
    "case",
    [
        "a job is still running",
        "a job is missing",
        "a gap in the attempt numbers",
        "attempts miscounted",
        "two attempts overlap",
        "a stale ack was accepted",
        "a dead job's newest attempt is not the one recorded",
        "dead with attempts left",
        "a succeeded job without its side effect",
        "acked before its run ended",
        "a run without a lease",
        "a run before its lease",
        "an attempt ran in two processes",
        "succeeded by a failing run",
    ],
)
def test_each_planted_violation_is_reported(case: str) -> None:
    jobs, attempts, effects, keys = broken(case)
    assert check(jobs, attempts, effects, keys).violations, case
