"""``--pool process``: the worker's child processes, seen from the worker.

Each child (:mod:`pgqueue.worker.child`) is a fresh interpreter (spawned,
never forked from the worker's threads and connections) that imports the
App once and runs one sync task at a time. The pool hands a job to an idle
child (or queues it until one is ready), relays the child's progress and
lease extensions, and resolves the job's future with the child's ``done``
message, or with how the child died. It stops children: ``stop_job`` turns
``should_stop()`` true in the child, ``kill_job`` sends SIGTERM and SIGKILL
``kill_grace`` later. A child that dies, or that reached
``max_tasks_per_child`` or ``max_memory_per_child``, is replaced.

The pool writes nothing to the database: the executor records every attempt.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.errors import InvalidOption
from pgqueue.worker import child_wire
from pgqueue.worker.app_path import CHILD_ENV

if TYPE_CHECKING:
    from pgqueue.models import LeasedJob

log = structlog.get_logger("pgqueue.worker")

#: Seconds a child may take to import the App and say it is ready.
START_TIMEOUT = 60.0
#: Seconds between attempts to start a replacement that failed to start.
RESTART_BACKOFF = 2.0
#: Replacements that failed to start in a row before the pool gives up (the
#: worker then stops the graceful way: its jobs go back to the queue).
RESTART_ATTEMPTS = 5

OnMessage = Callable[[dict[str, Any]], None]
#: What a child says about its running job, handed to the job's ``on_message``.
RELAYED = frozenset({"progress", "extend", "committing", "committed", "commit_failed"})


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What every child is told: where the App is, and which database and
    schema the worker serves (a re-pointed App follows the worker)."""

    app_path: str
    dsn: str
    schema: str


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How a job handed to a child ended: the child's ``done`` message, or
    (``message`` None) the child died first (``returncode``), or the job
    never reached a child (``pid`` None; ``handed_back``: no child will ever
    take it, the pool gave up, so it goes back to the queue)."""

    message: dict[str, Any] | None
    pid: int | None = None
    returncode: int | None = None
    handed_back: bool = False

    def death(self) -> str:
        """The child's death in words (for ``worker_crashed``)."""
        if self.pid is None:
            return "the job never reached a child process"
        return f"the child process (pid {self.pid}) running the task {exit_status(self.returncode)}"


def exit_status(returncode: int | None) -> str:
    """``exited with exit status N`` or ``was killed by signal 9 (SIGKILL)``."""
    if returncode is None:
        return "died"
    if returncode < 0:
        try:
            name = f" ({signal.Signals(-returncode).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-returncode}{name}"
    return f"exited with exit status {returncode}"


@dataclass(eq=False)
class _Pending:
    message: dict[str, Any]
    future: asyncio.Future[ChildOutcome]
    on_message: OnMessage
    job_id: int


@dataclass(eq=False)
class _Child:
    proc: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    running: _Pending | None = None
    tasks_run: int = 0
    ready: bool = False
    leaving: str | None = None  # why the pool ends it (retired, killed, closing)
    kill_timer: asyncio.TimerHandle | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid


class ProcessPool:
    """``size`` child processes running sync tasks one at a time each."""

    def __init__(
        self,
        spec: ChildSpec,
        size: int,
        *,
        kill_grace: float,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        on_fatal: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.on_fatal = on_fatal  # told when no replacement child can start
        self.spec = spec
        self.size = size
        self.kill_grace = kill_grace
        self.max_tasks = max_tasks_per_child
        self.max_memory = max_memory_per_child
        self.children: list[_Child] = []
        self.idle: deque[_Child] = deque()
        self.pending: deque[_Pending] = deque()
        self.by_job: dict[int, _Child] = {}
        self.stop_early: set[int] = set()  # stopped before they reached a child
        self.starting: set[asyncio.Task[None]] = set()
        self.closing = False
        self.broken = False  # replacements stopped starting: the worker is stopping
        #: Children started and replaced, by reason (crashed, timeout, max_tasks, ...).
        self.started_count = 0
        self.replaced: dict[str, int] = {}

    @property
    def alive(self) -> int:
        return len(self.children)

    # --- starting children -------------------------------------------------------

    async def start(self) -> None:
        """Start every child and wait until each imported the App; raises
        :class:`InvalidOption` (with the child's reason) when one cannot."""
        results = await asyncio.gather(
            *(self._spawn() for _ in range(self.size)), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.close()
            raise failures[0]
        log.info(
            "process pool started",
            children=self.size,
            pids=[c.pid for c in self.children],
            app=self.spec.app_path,
        )

    async def _spawn(self) -> _Child:
        ours, theirs = socket.socketpair()
        try:
            # Started from the loop's thread on purpose: the child's parent-death
            # signal follows the thread that started it, and this one lives as
            # long as the worker (a fork-exec takes a few ms).
            proc = subprocess.Popen(  # noqa: ASYNC220
                [
                    sys.executable,
                    "-m",
                    "pgqueue.worker.child",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env={**os.environ, CHILD_ENV: "1"},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours)
        child = _Child(proc, reader, writer)
        self.children.append(child)
        self.started_count += 1
        writer.write(
            child_wire.encode(
                {
                    "op": "hello",
                    "app_path": self.spec.app_path,
                    "dsn": self.spec.dsn,
                    "schema": self.spec.schema,
                    "sys_path": list(sys.path),
                    "measure_memory": self.max_memory is not None,
                }
            )
        )
        try:
            first = await asyncio.wait_for(_read(reader), START_TIMEOUT)
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError):
            first = None
        if first is None or first.get("op") != "ready":
            reason = (
                first.get("message")
                if first is not None and first.get("op") == "failed"
                else "it did not start"
            )
            self._forget(child)
            _signal(proc, signal.SIGKILL)
            await asyncio.get_running_loop().run_in_executor(None, proc.wait)
            writer.close()
            raise InvalidOption(f"--pool process: a child process could not load the App: {reason}")
        child.ready = True
        child.watcher = asyncio.create_task(self._watch(child), name=f"pgqueue-child-{proc.pid}")
        if self.closing:
            self._end(child, "closing")
        else:
            self._idle(child)
        return child

    def _replace(self, reason: str) -> None:
        self.replaced[reason] = self.replaced.get(reason, 0) + 1
        if self.closing:
            return
        task = asyncio.create_task(self._respawn())
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)

    async def _respawn(self) -> None:
        failures = 0
        while not self.closing:
            try:
                child = await self._spawn()
            except Exception as exc:
                failures += 1
                if failures >= RESTART_ATTEMPTS and self.on_fatal is not None:
                    self._give_up()
                    self.on_fatal("process pool", exc)
                    return
                log.error(
                    "could not start a replacement child process; retrying",
                    error=str(exc),
                    retry_in_seconds=RESTART_BACKOFF,
                )
                await asyncio.sleep(RESTART_BACKOFF)
                continue
            log.info("child process started", pid=child.pid)
            return

    def _give_up(self) -> None:
        """No child can start: jobs waiting for one go back to the queue."""
        self.broken = True
        while self.pending:
            entry = self.pending.popleft()
            if not entry.future.done():
                entry.future.set_result(ChildOutcome(None, handed_back=True))

    # --- jobs --------------------------------------------------------------------

    def submit(self, job: LeasedJob, on_message: OnMessage) -> asyncio.Future[ChildOutcome]:
        """Run ``job`` in a child; the future resolves when it ended there."""
        message = {
            "op": "run",
            "job": {
                "job_id": job.job_id,
                "attempt": job.attempt,
                "attempt_id": job.attempt_id,
                "queue": job.queue,
                "task": job.task,
                "payload": job.payload,
                "tags": job.tags or [],
                "meta": job.meta,
                "group_key": job.group_key,
            },
        }
        future: asyncio.Future[ChildOutcome] = asyncio.get_running_loop().create_future()
        entry = _Pending(message, future, on_message, job.job_id)
        if self.closing or self.broken:
            future.set_result(ChildOutcome(None, handed_back=self.broken))
        elif self.idle:
            self._dispatch(self.idle.popleft(), entry)
        else:
            self.pending.append(entry)
        return future

    def _dispatch(self, child: _Child, entry: _Pending) -> None:
        child.running = entry
        self.by_job[entry.job_id] = child
        child.writer.write(child_wire.encode(entry.message))
        if entry.job_id in self.stop_early:
            self.stop_early.discard(entry.job_id)
            child.writer.write(child_wire.encode({"op": "stop", "job_id": entry.job_id}))

    def _idle(self, child: _Child) -> None:
        if self.pending:
            self._dispatch(child, self.pending.popleft())
        else:
            self.idle.append(child)

    def stop_job(self, job_id: int) -> None:
        """Turn ``should_stop()`` true for ``job_id`` in its child."""
        child = self.by_job.get(job_id)
        if child is not None:
            _send(child, {"op": "stop", "job_id": job_id})
        elif any(p.job_id == job_id for p in self.pending):
            self.stop_early.add(job_id)

    def answer_commit(self, job_id: int, allowed: bool) -> None:
        """Let the child running ``job_id`` commit its ``context.transaction()`` (or not)."""
        child = self.by_job.get(job_id)
        if child is not None:
            _send(child, {"op": "commit_ok" if allowed else "commit_refused"})

    def stop_all(self) -> None:
        """Shutdown: ``should_stop()`` turns true in every child running a job."""
        for job_id in list(self.by_job):
            self.stop_job(job_id)
        for entry in self.pending:
            self.stop_early.add(entry.job_id)

    def kill_job(self, job_id: int, reason: str) -> None:
        """End ``job_id`` now: SIGTERM to its child, SIGKILL after the kill
        grace (a job still waiting for a child is dropped)."""
        child = self.by_job.get(job_id)
        if child is not None:
            self._end(child, reason)
            return
        for entry in list(self.pending):
            if entry.job_id == job_id:
                self.pending.remove(entry)
                if not entry.future.done():
                    entry.future.set_result(ChildOutcome(None))

    def _end(self, child: _Child, reason: str) -> None:
        """Stop a child (SIGTERM, then SIGKILL after the grace)."""
        if child.leaving is not None and child.kill_timer is not None:
            return
        child.leaving = reason
        if child in self.idle:
            self.idle.remove(child)
        _signal(child.proc, signal.SIGTERM)
        child.kill_timer = asyncio.get_running_loop().call_later(
            self.kill_grace, _signal, child.proc, signal.SIGKILL
        )

    def _retire(self, child: _Child, reason: str) -> None:
        """The child finished its job but reached a limit: it leaves by itself."""
        child.leaving = reason
        _send(child, {"op": "exit"})
        child.kill_timer = asyncio.get_running_loop().call_later(
            self.kill_grace, _signal, child.proc, signal.SIGKILL
        )

    # --- one child's messages and death -----------------------------------------------

    async def _watch(self, child: _Child) -> None:
        try:
            while True:
                message = await _read(child.reader)
                if message is None:
                    break
                op = message.get("op")
                entry = child.running
                if op == "done" and entry is not None:
                    self._done(child, entry, message)
                elif op in RELAYED and entry is not None and message.get("job_id") == entry.job_id:
                    entry.on_message(message)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        returncode = await asyncio.get_running_loop().run_in_executor(None, child.proc.wait)
        self._died(child, returncode)

    def _done(self, child: _Child, entry: _Pending, message: dict[str, Any]) -> None:
        child.running = None
        self.by_job.pop(entry.job_id, None)
        child.tasks_run += 1
        rss = message.get("rss")
        if child.leaving is not None:
            pass  # being stopped: its death replaces it
        elif self.max_tasks is not None and child.tasks_run >= self.max_tasks:
            self._retire(child, "max_tasks")
        elif self.max_memory is not None and isinstance(rss, int) and rss >= self.max_memory:
            self._retire(child, "max_memory")
        else:
            self._idle(child)
        if not entry.future.done():
            entry.future.set_result(ChildOutcome(message, child.pid))

    def _died(self, child: _Child, returncode: int) -> None:
        if child.kill_timer is not None:
            child.kill_timer.cancel()
        child.writer.close()
        self._forget(child)
        entry = child.running
        child.running = None
        reason = child.leaving or "crashed"
        fields: dict[str, Any] = {"pid": child.pid, "status": exit_status(returncode)}
        if entry is not None:
            self.by_job.pop(entry.job_id, None)
            fields["job_id"] = entry.job_id
        if child.leaving is None:
            log.error("child process crashed; starting a new one", **fields)
        elif child.leaving != "closing":
            log.info("child process replaced", reason=reason, tasks_run=child.tasks_run, **fields)
        if child.leaving != "closing":
            self._replace(reason)
        if entry is not None and not entry.future.done():
            entry.future.set_result(ChildOutcome(None, child.pid, returncode))

    def _forget(self, child: _Child) -> None:
        if child in self.children:
            self.children.remove(child)
        if child in self.idle:
            self.idle.remove(child)

    # --- the end -----------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every child: idle ones leave at once, busy ones (handed back
        by the shutdown) are stopped; none outlives this call."""
        self.closing = True
        for task in list(self.starting):
            task.cancel()
        await asyncio.gather(*self.starting, return_exceptions=True)
        while self.pending:
            entry = self.pending.popleft()
            if not entry.future.done():
                entry.future.set_result(ChildOutcome(None))
        children = list(self.children)
        for child in children:
            if child.running is None and child.leaving is None:
                child.leaving = "closing"
                _send(child, {"op": "exit"})
            elif child.kill_timer is None:
                self._end(child, "closing")
        watchers = [c.watcher for c in children if c.watcher is not None]
        if watchers:
            _, late = await asyncio.wait(watchers, timeout=self.kill_grace)
            for child in children:
                if child.proc.poll() is None:
                    _signal(child.proc, signal.SIGKILL)
            if late:
                await asyncio.wait(late, timeout=self.kill_grace)
        for child in children:
            if child.watcher is None:  # never got ready
                _signal(child.proc, signal.SIGKILL)
        self.idle.clear()


def _send(child: _Child, message: dict[str, Any]) -> None:
    if not child.writer.is_closing():
        child.writer.write(child_wire.encode(message))


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


async def _read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message from a child; None at end of stream."""
    try:
        header = await reader.readexactly(child_wire.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    body = await reader.readexactly(child_wire.frame_length(header))
    return child_wire.decode(body)
