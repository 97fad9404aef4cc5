"""The process pool's options and wire, without processes: sizes, bad
options (clear errors, nothing started), exit statuses in words, frames."""

from __future__ import annotations

import signal
import socket

import pytest

from pgqueue.errors import InvalidDuration, InvalidOption
from pgqueue.worker import child_wire
from pgqueue.worker.app_path import load_app
from pgqueue.worker.process_pool import ChildOutcome, exit_status
from pgqueue.worker.settings import WorkerSettings, parse_memory


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MB", 512_000_000),
        ("512mb", 512_000_000),
        ("1GiB", 1024**3),
        ("1.5G", 1_500_000_000),
        ("800K", 800_000),
        ("4096", 4096),
        (1000, 1000),
    ],
)
def test_memory_sizes(text: str | int, size: int) -> None:
    assert parse_memory("max_memory_per_child", text) == size


@pytest.mark.parametrize("bad", ["lots", "12XB", "", "-5MB", 0, True, 1.5])
def test_bad_memory_sizes_name_the_option(bad: object) -> None:
    with pytest.raises(InvalidOption, match="max_memory_per_child"):
        parse_memory("max_memory_per_child", bad)  # type: ignore[arg-type]


def test_pool_options_are_checked_once() -> None:
    settings = WorkerSettings.build(
        pool="process", kill_grace="2s", max_tasks_per_child=10, max_memory_per_child="1GB"
    )
    assert (settings.pool, settings.kill_grace) == ("process", 2.0)
    assert (settings.max_tasks_per_child, settings.max_memory_per_child) == (10, 10**9)
    assert WorkerSettings.build().pool == "thread"
    with pytest.raises(InvalidOption, match="pool must be one of thread, process, got 'fork'"):
        WorkerSettings.build(pool="fork")
    with pytest.raises(InvalidOption, match="need pool='process'"):
        WorkerSettings.build(max_tasks_per_child=3)
    with pytest.raises(InvalidOption, match="max_tasks_per_child"):
        WorkerSettings.build(pool="process", max_tasks_per_child=0)
    with pytest.raises(InvalidDuration, match="kill_grace"):
        WorkerSettings.build(pool="process", kill_grace=-1)
    with pytest.raises(InvalidOption, match="app_path"):
        WorkerSettings.build(pool="process", app_path="no-colon")


def test_a_dead_child_is_described_by_its_status_or_signal() -> None:
    assert exit_status(7) == "exited with exit status 7"
    assert exit_status(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    assert exit_status(-signal.SIGSEGV) == "was killed by signal 11 (SIGSEGV)"
    assert exit_status(-200) == "was killed by signal 200"
    assert ChildOutcome(None, 42, -9).death() == (
        "the child process (pid 42) running the task was killed by signal 9 (SIGKILL)"
    )


def test_frames_carry_json_objects_and_refuse_absurd_lengths() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        message = {"op": "run", "job": {"job_id": 1, "payload": {"ü": [1, None]}}}
        ours.sendall(child_wire.encode(message))
        assert child_wire.read_blocking(theirs) == message
        ours.sendall(child_wire.HEADER.pack(child_wire.MAX_FRAME + 1))
        with pytest.raises(ValueError, match="over the"):
            child_wire.read_blocking(theirs)
        ours.close()
        assert child_wire.read_blocking(theirs) is None
    with pytest.raises(ValueError, match="JSON object"):
        child_wire.decode(b"[1]")


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("nocolon", "must look like pkg.module:app"),
        ("tests.apps.no_such_module:app", "importing 'tests.apps.no_such_module' failed"),
        ("tests.apps.process_pool:whoami", "'whoami' is function, not a pgqueue.App"),
        ("/no/such/file.py:app", "no such file"),
    ],
)
def test_an_app_path_a_child_cannot_load_is_a_clear_error(path: str, fragment: str) -> None:
    with pytest.raises(InvalidOption, match="app path") as caught:
        load_app(path, "postgresql://localhost/x", "pgqueue")
    assert fragment in str(caught.value)
