"""Inject known bugs one at a time and see whether the tests catch them.

Each mutation is a named set of exact text replacements in the source (the
original text must be found exactly once, so a mutation never lands somewhere
else after an edit), plus the tests that are meant to catch it. For each
mutation the script applies it, runs its tests in a fresh pytest process (the
test session migrates its template database from ``sql/schema.sql``, so a
mutated schema is what the tests see), restores the files, and reports::

    python tools/mutations.py --list              # the mutations
    python tools/mutations.py                     # run every one
    python tools/mutations.py lease-head-serial   # run some
    python tools/mutations.py NAME -- tests/x.py  # run NAME against other tests
    python tools/mutations.py --check             # only: is every original text there once?

A mutation is *caught* when at least one test fails (a failure, not a setup
error: a schema that does not even install proves nothing about the tests),
*missed* when they all pass. Exit status 1 when any is missed or errored.
Files are restored after each mutation, on Ctrl-C and on SIGTERM too.

Needs a PostgreSQL for the tests (``PGQUEUE_TEST_DSN``, see tests/fixtures/postgres.py).
Not part of the default test run; ``tests/unit/test_mutations.py`` only checks
that every mutation still applies, so this list does not rot.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "sql/schema.sql"


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the repository root
    old: str  # found exactly once
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    bug: str  # what goes wrong, in a user's words
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids or files meant to catch it


DEDUP_BOUNDARY = ("tests/test_dedup_window.py::test_the_window_boundary_to_the_microsecond",)
LEASE_GUARDS = ("tests/test_lease_guards.py",)
HIJACK = ("tests/test_security_definer_hijack.py",)

# The lease's three scans (see tests/test_lease_guards.py), each found by the
# lines that open its WHERE clause.
_CURSOR_SCAN = (
    "                  AND j.priority = v_cp AND (j.run_at, j.id) > (v_cr, v_ci)\n"
    "                  AND j.status = 'queued' AND j.run_at <= v_now\n"
    "                  AND (j.serial_key IS NULL OR (\n"
)
_HEAD_SCAN = (
    "                  AND j.priority < v_cp\n"
    "                  AND j.status = 'queued' AND j.run_at <= v_now\n"
    "                  AND (j.serial_key IS NULL OR (\n"
)
_LIMITED_SCAN = (
    "                          AND j.run_at <= v_now\n"
    "                          AND j.task <> ALL (v_blocked)\n"
    "                          AND (j.serial_key IS NULL OR (\n"
)


def _scan_edits(scan: str, old: str, new: str) -> tuple[Edit, ...]:
    assert scan.count(old) == 1, (scan, old)
    return (Edit(SCHEMA, scan, scan.replace(old, new)),)


MUTATIONS: tuple[Mutation, ...] = (
    # --- durable tasks ------------------------------------------------------------
    Mutation(
        "step-store-unfenced",
        "an attempt whose lease was reaped still stores its step",
        (
            Edit(
                SCHEMA,
                "    SELECT j.has_records INTO v_records FROM {schema}.jobs_live j\n"
                "    WHERE j.id = p_job_id AND j.attempt_id = p_attempt_id"
                " AND j.status = 'running'\n",
                "    SELECT j.has_records INTO v_records FROM {schema}.jobs_live j\n"
                "    WHERE j.id = p_job_id\n",
            ),
        ),
        ("tests/test_durable_steps.py::test_a_stale_attempt_cannot_store_a_step",),
    ),
    Mutation(
        "step-runs-again",
        "a stored step of a sync task runs its function again on a retry",
        (
            Edit(
                "pgqueue/worker/durable.py",
                "        found = self.records_sync().get(name)\n"
                '        if found is not None and found.kind == "step":\n',
                "        found = self.records_sync().get(name)\n"
                '        if found is not None and found.kind == "step" and False:\n',
            ),
        ),
        ("tests/test_durable_steps.py::test_a_sync_task_runs_each_step_once_across_retries",),
    ),
    Mutation(
        "sleep-spends-an-attempt",
        "context.sleep spends an attempt (a job of max_attempts=1 dies asleep)",
        (
            Edit(
                SCHEMA,
                "WHEN f.outcome IN ('snoozed', 'slept') THEN 'snooze'",
                "WHEN f.outcome = 'snoozed' THEN 'snooze'",
            ),
        ),
        (
            "tests/test_durable_sleep_events.py::"
            "test_a_sleep_frees_the_slot_and_does_not_spend_an_attempt",
        ),
    ),
    Mutation(
        "event-releases-nothing",
        "send_event stores the event but leaves the waiting jobs waiting",
        (
            Edit(
                SCHEMA,
                "    SELECT array_agg(g.job_id) INTO v_ids FROM got g;\n"
                "    RETURN {schema}.release_event_waits(v_ids);\n",
                "    SELECT array_agg(g.job_id) INTO v_ids FROM got g;\n    RETURN 0;\n",
            ),
        ),
        (
            "tests/test_durable_sleep_events.py::"
            "test_an_event_sent_from_sql_releases_only_when_its_transaction_commits",
        ),
    ),
    Mutation(
        "event-before-wait-missed",
        "a job waiting for an event sent before the wait waits forever",
        (
            Edit(
                SCHEMA,
                "    SELECT e.payload INTO v_payload FROM {schema}.events e WHERE e.key = p_key;\n",
                "    SELECT e.payload INTO v_payload FROM {schema}.events e WHERE false;\n",
            ),
        ),
        (
            "tests/test_durable_sleep_events.py::test_an_event_sent_before_the_wait_is_found_at_once",
        ),
    ),
    # --- issue 43 #13: the dedup window's boundary ---------------------------------
    Mutation(
        "dedup-window-live-boundary",
        "a live job created exactly one dedup_window ago still counts as a hit",
        (
            Edit(
                SCHEMA,
                "WHERE l.queue = p_queue AND l.dedup_key = p_key"
                " AND l.created_at > now() - p_window",
                "WHERE l.queue = p_queue AND l.dedup_key = p_key"
                " AND l.created_at >= now() - p_window",
            ),
        ),
        DEDUP_BOUNDARY,
    ),
    Mutation(
        "dedup-window-finished-boundary",
        "a finished job created exactly one dedup_window ago still counts as a hit",
        (
            Edit(
                SCHEMA,
                "AND h.queue = p_queue AND h.dedup_key = p_key AND h.created_at > now() - p_window",
                "AND h.queue = p_queue AND h.dedup_key = p_key"
                " AND h.created_at >= now() - p_window",
            ),
        ),
        DEDUP_BOUNDARY,
    ),
    Mutation(
        "dedup-window-archive-boundary",
        "an archived job created exactly one dedup_window ago still counts as a hit",
        (
            Edit(
                SCHEMA,
                "WHERE a.queue = p_queue AND a.dedup_key = p_key"
                " AND a.created_at > now() - p_window",
                "WHERE a.queue = p_queue AND a.dedup_key = p_key"
                " AND a.created_at >= now() - p_window",
            ),
        ),
        DEDUP_BOUNDARY,
    ),
    Mutation(
        "dedup-window-release-boundary",
        "a live job created exactly one dedup_window ago keeps its key",
        (
            Edit(
                SCHEMA,
                "AND j.created_at <= now() - p_window;",
                "AND j.created_at < now() - p_window;",
            ),
        ),
        DEDUP_BOUNDARY,
    ),
    # --- issue 43 #14: leasing a job that is not due --------------------------------
    Mutation(
        "lease-stages-jobs-not-due",
        "the lease stages (and so runs) scheduled jobs before their run_at",
        (
            Edit(
                SCHEMA,
                "WHERE j.stage = 'scheduled' AND j.run_at <= v_now) THEN",
                "WHERE j.stage = 'scheduled') THEN",
            ),
            Edit(
                SCHEMA,
                "            WHERE stage = 'scheduled' AND run_at <= v_now\n",
                "            WHERE stage = 'scheduled'\n",
            ),
        ),
        LEASE_GUARDS,
    ),
    Mutation(
        "lease-cursor-run-at",
        "the cursor scan leases a queued job whose run_at is after the lease's clock",
        _scan_edits(_CURSOR_SCAN, " AND j.run_at <= v_now", ""),
        LEASE_GUARDS,
    ),
    Mutation(
        "lease-head-run-at",
        "the head scan leases a queued job whose run_at is after the lease's clock",
        _scan_edits(_HEAD_SCAN, " AND j.run_at <= v_now", ""),
        LEASE_GUARDS,
    ),
    Mutation(
        "lease-task-limited-run-at",
        "the task-limited scan leases a queued job whose run_at is after the lease's clock",
        _scan_edits(_LIMITED_SCAN, "AND j.run_at <= v_now", "AND true"),
        LEASE_GUARDS,
    ),
    # --- issue 43 #16: serial keys and the counted flag, in every scan ---------------
    Mutation(
        "lease-cursor-serial",
        "the cursor scan ignores serial keys",
        _scan_edits(_CURSOR_SCAN, "(j.serial_key IS NULL OR (", "(true OR ("),
        LEASE_GUARDS,
    ),
    Mutation(
        "lease-head-serial",
        "the head scan ignores serial keys",
        _scan_edits(_HEAD_SCAN, "(j.serial_key IS NULL OR (", "(true OR ("),
        LEASE_GUARDS,
    ),
    Mutation(
        "lease-task-limited-serial",
        "the task-limited scan ignores serial keys",
        _scan_edits(_LIMITED_SCAN, "(j.serial_key IS NULL OR (", "(true OR ("),
        LEASE_GUARDS,
    ),
    Mutation(
        "task-limit-counted",
        "jobs of a concurrency-limited task are not counted once running",
        (
            Edit(
                SCHEMA,
                "counted = j.counted OR v_queue.limited OR j.task = ANY (v_limited),",
                "counted = j.counted OR v_queue.limited,",
            ),
        ),
        LEASE_GUARDS,
    ),
    Mutation(
        "queue-limit-counted-plain",
        "jobs of a concurrency-limited queue leased by the plain scans are not counted",
        (
            Edit(
                SCHEMA,
                "                counted = j.counted OR v_queue.limited,\n",
                "                counted = j.counted,\n",
            ),
        ),
        LEASE_GUARDS,
    ),
    Mutation(
        "queue-limit-counted-task-limited",
        "jobs of a concurrency-limited queue leased by the task-limited scan are not counted",
        (
            Edit(
                SCHEMA,
                "counted = j.counted OR v_queue.limited OR j.task = ANY (v_limited),",
                "counted = j.counted OR j.task = ANY (v_limited),",
            ),
        ),
        LEASE_GUARDS,
    ),
    # --- issue 43 #17: the event stream's listener ------------------------------------
    Mutation(
        "subscribe-break-on-due-hint",
        "a 'w:' hint drops the notifications read with it (a subscriber misses events)",
        (
            Edit(
                "pgqueue/subscribe.py",
                '                elif payload.startswith("w:"):\n'
                "                    recheck = True\n",
                '                elif payload.startswith("w:"):\n'
                "                    recheck = True\n"
                "                    break\n",
            ),
        ),
        ("tests/test_subscribe.py::test_a_due_hint_does_not_swallow_what_arrived_with_it",),
    ),
    # --- issue 43 #15: a SECURITY DEFINER function without its pinned search_path ----
    Mutation(
        "enqueue-job-search-path",
        "enqueue_job runs as the owner with the caller's search_path (hijackable)",
        (
            Edit(
                SCHEMA,
                "p_default_priority integer DEFAULT NULL::integer,"
                " p_group_key text DEFAULT NULL::text)"
                " RETURNS TABLE(job_id bigint, created boolean)\n"
                "    LANGUAGE plpgsql SECURITY DEFINER\n"
                "    SET search_path TO 'pg_catalog', 'pg_temp'\n",
                "p_default_priority integer DEFAULT NULL::integer,"
                " p_group_key text DEFAULT NULL::text)"
                " RETURNS TABLE(job_id bigint, created boolean)\n"
                "    LANGUAGE plpgsql SECURITY DEFINER\n",
            ),
        ),
        HIJACK,
    ),
)

BY_NAME = {m.name: m for m in MUTATIONS}
assert len(BY_NAME) == len(MUTATIONS), "mutation names are unique"


def problems(root: Path = ROOT) -> list[str]:
    """What keeps a mutation from applying: an original text found other than
    once, a replacement that changes nothing, a test file that is gone."""
    found = []
    for mutation in MUTATIONS:
        for edit in mutation.edits:
            count = (root / edit.path).read_text().count(edit.old)
            if count != 1:
                found.append(f"{mutation.name}: found {count} times in {edit.path}: {edit.old!r}")
            if edit.old == edit.new:
                found.append(f"{mutation.name}: an edit that changes nothing")
        for test in mutation.tests:
            if not (root / test.split("::")[0]).is_file():
                found.append(f"{mutation.name}: no test file {test}")
    return found


@contextmanager
def applied(mutation: Mutation, root: Path = ROOT) -> Iterator[None]:
    """The files with ``mutation`` applied; restored on leaving, however that happens."""
    originals: dict[Path, str] = {}
    try:
        for edit in mutation.edits:
            path = root / edit.path
            text = path.read_text()
            originals.setdefault(path, text)
            count = text.count(edit.old)
            assert count == 1, f"{mutation.name}: found {count} times in {edit.path}"
            path.write_text(text.replace(edit.old, edit.new))
        yield
    finally:
        for path, text in originals.items():
            path.write_text(text)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through applied(), which restores the files


def run_tests(tests: Sequence[str], extra: Sequence[str]) -> tuple[str, float]:
    """'caught', 'missed' or 'error' for one pytest run of ``tests``."""
    with tempfile.TemporaryDirectory(prefix="pgqueue-mutations-") as tmp:
        report = Path(tmp) / "report.xml"
        command = [
            sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            f"--junitxml={report}", *extra, *tests,
        ]  # fmt: skip
        started = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        if result.returncode not in (0, 1) or not report.exists():
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
            return "error", took
        cases = ET.parse(report).getroot().iter("testcase")
        outcomes = [[child.tag for child in case] for case in cases]
    if any("failure" in tags for tags in outcomes):
        return "caught", took
    if result.returncode == 0 and outcomes:
        return "missed", took
    sys.stderr.write(result.stdout[-3000:])
    return "error", took  # errors in setup only, or nothing ran


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    tests_override: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, tests_override = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="only check that each applies")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip running the tests unmutated first"
    )
    parser.add_argument("--pytest-arg", action="append", default=[], help="passed to pytest")
    options = parser.parse_args(args)

    if options.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name:36} {mutation.bug}")
        return 0
    unknown = [n for n in options.names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(unknown)} (see --list)")
    found = problems()
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    if options.check:
        print(f"all {len(MUTATIONS)} mutations apply")
        return 0

    chosen = [BY_NAME[n] for n in options.names] or list(MUTATIONS)
    signal.signal(signal.SIGTERM, _terminate)
    if not options.no_baseline:
        selection = tests_override or sorted({t for m in chosen for t in m.tests})
        outcome, took = run_tests(selection, options.pytest_arg)
        if outcome != "missed":  # unmutated, every test must pass
            print(f"baseline: the tests do not pass unmutated ({outcome}, {took:.0f} s)")
            return 1
        print(f"baseline: pass ({took:.0f} s)")
    results = {}
    try:
        for mutation in chosen:
            with applied(mutation):
                outcome, took = run_tests(tests_override or mutation.tests, options.pytest_arg)
            results[mutation.name] = outcome
            print(
                f"{outcome.upper():7} {mutation.name:36} ({took:.0f} s) {mutation.bug}", flush=True
            )
    except KeyboardInterrupt:
        print("interrupted: files restored", file=sys.stderr)
        return 130
    missed = [n for n, outcome in results.items() if outcome != "caught"]
    print(
        f"{len(results) - len(missed)}/{len(results)} caught"
        + (f"; not: {', '.join(missed)}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
