"""A child process of ``--pool process`` (``python -m pgqueue.worker.child FD PARENT``).

It imports the App once, by its import path, then runs one sync task at a
time as its worker asks (see :mod:`pgqueue.worker.child_wire`): the task's
middleware runs around it here, its ``JobContext`` sends progress and lease
extensions to the worker, and its result or exception goes back as JSON.
The child holds no lease and writes no job: the worker records every
attempt. A task may enqueue jobs (the App opens its own connections here).

It never outlives its worker: the kernel sends it SIGKILL when the worker
dies (Linux's parent-death signal), and a thread that reads the worker's
socket exits the process as soon as the socket closes. SIGINT is ignored (a
Ctrl-C reaches the worker, whose shutdown turns ``should_stop()`` true
here); SIGTERM keeps its default action, which the worker sends on a hard
time limit.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pgqueue import middleware as mw
from pgqueue.context import JobContext
from pgqueue.errors import LeaseLost
from pgqueue.models import LeasedJob
from pgqueue.payloads import UnstoredResult, encode_result
from pgqueue.worker import child_wire
from pgqueue.worker.app_path import CHILD_ENV, load_app
from pgqueue.worker.durable import DurableSource, Parked, SleepUntil
from pgqueue.worker.executor import classify_exception
from pgqueue.worker.parts import WorkerApp
from pgqueue.worker.task_transaction import TaskTransactions, TaskTransactionSource

PR_SET_PDEATHSIG = 1


class ChildTransactions(TaskTransactions):
    """``context.transaction()`` in a child: the block and the job's fenced
    success commit together on a connection of the child, as in a worker
    thread. Before the COMMIT the child asks its worker, which from then on
    treats the row changing under its heartbeat as this commit (not a lost
    lease) and neither kills the child nor records the attempt again; a
    worker that already gave the job up refuses, and the block rolls back
    with :class:`LeaseLost`."""

    def __init__(self, child: Child, *args: Any) -> None:
        self._child = child
        self._committing = False
        super().__init__(*args)

    @property  # type: ignore[override]
    def committing(self) -> bool:
        return self._committing

    @committing.setter
    def committing(self, value: bool) -> None:
        if value:
            self._child.ask_commit(self.job.job_id)  # raises LeaseLost when refused
        elif self._committing:
            self._child.send({"op": "commit_failed", "job_id": self.job.job_id})
        self._committing = value


def rss_bytes() -> int:
    """This process's peak resident memory so far: a task that reached the
    limit and freed its memory before returning still reached it."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(usage if sys.platform == "darwin" else usage * 1024)  # bytes there, KiB here


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the worker died before the signal was set
        os._exit(0)


class Child:
    """Runs jobs from the worker, one at a time, until told to exit."""

    def __init__(self, sock: socket.socket, app: Any, measure_memory: bool = True) -> None:
        self.sock = sock
        self.app = app
        self.measure_memory = measure_memory  # rss in every answer (--max-memory-per-child)
        self.middleware = tuple(app.middleware)
        self.send_lock = threading.Lock()
        self.jobs: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.current: JobContext | None = None
        self.stop_asked: set[int] = set()  # stops that came before their job began
        self.commit_answer = threading.Event()
        self.commit_allowed = False
        self.transactions: TaskTransactionSource | None = None  # opened on first use
        self.durable: DurableSource | None = None

    def send(self, message: dict[str, Any]) -> None:
        data = child_wire.encode(message)
        with self.send_lock:
            self.sock.sendall(data)

    def read_forever(self) -> None:
        """The worker's messages; the process ends when the worker's end closes."""
        try:
            while True:
                message = child_wire.read_blocking(self.sock)
                if message is None:
                    break
                op = message.get("op")
                if op == "run":
                    self.jobs.put(message["job"])
                elif op == "stop":
                    self._stop(int(message["job_id"]))
                elif op == "exit":
                    self.jobs.put(None)
                elif op in ("commit_ok", "commit_refused"):
                    self.commit_allowed = op == "commit_ok"
                    self.commit_answer.set()
        except (OSError, ValueError):
            pass
        os._exit(0)  # the worker is gone (or closed us): never outlive it

    def ask_commit(self, job_id: int) -> None:
        """Ask the worker whether this attempt may still commit its success."""
        self.commit_answer.clear()
        self.send({"op": "committing", "job_id": job_id})
        self.commit_answer.wait()
        if not self.commit_allowed:
            raise LeaseLost([job_id])

    def _transactions_for(self, job: dict[str, Any]) -> ChildTransactions:
        if self.transactions is None:
            parts = WorkerApp.of(self.app)  # the one reader of an App's pools
            self.transactions = TaskTransactionSource(parts.database, parts.ctx, 1)
        source = self.transactions
        leased = LeasedJob(
            job_id=int(job["job_id"]),
            attempt_id=int(job["attempt_id"]),
            attempt=int(job["attempt"]),
            task=job["task"],
            queue=job["queue"],
            payload=job["payload"],
            lease_expires_at=datetime.now(UTC),
        )
        notify = partial(self.send, {"op": "committed", "job_id": leased.job_id})
        return ChildTransactions(
            self, source.database, source.connections, source.ctx, leased, notify
        )

    def _durable(self) -> DurableSource:
        """Durable calls in this child run their fenced statements on its task
        connections, as a thread of the worker would."""
        if self.durable is None:
            assert self.transactions is not None  # made by _transactions_for first
            parts = WorkerApp.of(self.app)
            self.durable = DurableSource(
                parts.database, self.transactions.connections, self.app.max_result_bytes
            )
        return self.durable

    def close(self) -> None:
        """Close the connections this child opened."""
        if self.transactions is not None:
            asyncio.run(self.transactions.close())
        self.app.close()

    def _stop(self, job_id: int) -> None:
        with self.lock:
            if self.current is not None and self.current.job_id == job_id:
                self.current.request_stop()
            else:
                self.stop_asked.add(job_id)

    def serve(self) -> int:
        threading.Thread(target=self.read_forever, name="pgqueue-child-reader", daemon=True).start()
        while True:
            job = self.jobs.get()
            if job is None:
                return 0
            self.send(self.run(job))

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run one job; the ``done`` message to send."""
        job_id = int(job["job_id"])
        done: dict[str, Any] = {"op": "done", "job_id": job_id}
        payload: dict[str, Any] = job["payload"]
        task = self.app.tasks.get(job["task"])
        if task is None:
            done["failure"] = {
                "outcome": "failed",
                "code": "unknown_task",
                "message": f"no task named {job['task']!r} in the child's App",
                "trace": None,
                "delay": None,
                "permanent": False,
            }
            return done
        kwargs = payload
        if not task.pass_context and not self.middleware:
            return self._call(done, task, payload, partial(task.func, **payload))
        context = JobContext(
            job_id,
            int(job["attempt"]),
            int(job["attempt_id"]),
            job["queue"],
            job["task"],
            tags=list(job.get("tags") or []),
            meta=job.get("meta"),
            group_key=job.get("group_key"),
            _extend=partial(self._extend, job_id),
            _progress=partial(self._progress, job_id),
            _dependencies=partial(self.app.job_dependencies, job_id),
            _transactions=self._transactions_for(job),
            _durable=self._durable(),
        )
        with self.lock:
            self.current = context
            if job_id in self.stop_asked:
                self.stop_asked.discard(job_id)
                context.request_stop()
        if task.pass_context:
            kwargs = {**payload, "context": context}
        call = partial(task.func, **kwargs)
        if self.middleware:
            call = partial(mw.run_sync, self.middleware, context, call)
        try:
            return self._call(done, task, payload, call)
        finally:
            with self.lock:
                self.current = None

    def _call(
        self, done: dict[str, Any], task: Any, payload: dict[str, Any], call: Callable[[], Any]
    ) -> dict[str, Any]:
        """Call the task; ``done`` with its result or how it failed."""
        try:
            value = call()
        except SleepUntil as exc:  # context.sleep: the worker queues the job again
            done["suspend"] = {"sleep_until": exc.wake_at.isoformat(), "message": str(exc)}
        except Parked as exc:  # context.wait_for_event: the job already waits
            done["suspend"] = {"event": exc.key}
        except BaseException as exc:  # SystemExit included: the attempt failed
            outcome, code, message, trace, delay, permanent = classify_exception(exc, task, payload)
            done["failure"] = {
                "outcome": outcome.value,
                "code": code,
                "message": message,
                "trace": trace,
                "delay": delay,
                "permanent": permanent,
            }
        else:
            encoded = encode_result(value, self.app.max_result_bytes)
            if isinstance(encoded, UnstoredResult):
                done["result"] = None
                done["unstored"] = str(encoded)
            else:
                done["result"] = encoded
        if self.measure_memory:
            done["rss"] = rss_bytes()
        return done

    def _extend(self, job_id: int, seconds: float) -> None:
        self.send({"op": "extend", "job_id": job_id, "seconds": float(seconds)})

    def _progress(self, job_id: int, text: str) -> None:
        self.send({"op": "progress", "job_id": job_id, "text": text})


def main(argv: list[str]) -> int:
    """The child's life: handshake, import the App, serve jobs."""
    if len(argv) != 3:
        print("usage: python -m pgqueue.worker.child FD PARENT_PID", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[1]))
    sock.setblocking(True)
    _die_with_parent(int(argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[CHILD_ENV] = "1"
    hello = child_wire.read_blocking(sock)
    if hello is None:
        return 0
    sys.path[:] = [p for p in hello["sys_path"] if isinstance(p, str)]
    try:
        app = load_app(hello["app_path"], hello["dsn"], hello["schema"])
    except Exception as exc:
        sock.sendall(child_wire.encode({"op": "failed", "message": str(exc)}))
        return 3
    child = Child(sock, app, bool(hello.get("measure_memory", True)))
    child.send({"op": "ready", "pid": os.getpid()})
    code = child.serve()
    try:
        child.close()
    except Exception:  # leaving anyway: the worker recorded every attempt
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
