"""Worker processes: started the same way for every system.

Each worker is a fresh interpreter (multiprocessing "spawn"). It imports the
adapter, connects and registers its task, then signals *ready* and blocks on
*go*; the measured interval starts when the controller sets *go*, so process
start-up and imports are excluded equally for all systems.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.process
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common import WorkerControl, WorkerOptions

_CTX = multiprocessing.get_context("spawn")


def _child(
    system: str, dsn: str, opts: dict[str, Any], log_path: str, ready: Any, go: Any, stop: Any
) -> None:
    # Every system's worker output (per-job log lines included) goes to a file,
    # not to the terminal: the same sink for all.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from benchmarks.adapters import SYSTEMS

    ctl = WorkerControl(WorkerOptions(**opts), ready, go, stop)
    SYSTEMS[system].worker_main(dsn, ctl)


def _children(parents: list[int]) -> list[int]:
    """Live child processes of ``parents`` (Linux /proc)."""
    wanted = set(parents)
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) in wanted:
            out.append(int(entry.name))
    return out


class WorkerGroup:
    def __init__(
        self,
        system: str,
        dsn: str,
        procs: int,
        record: bool = False,
        profile: str = "throughput",
    ) -> None:
        self.system = system
        self.profile = profile
        self.dsn = dsn
        self.procs = procs
        self.record = record
        self._tmp = tempfile.mkdtemp(prefix="pgqb-")
        self._go = _CTX.Event()
        self._stop = _CTX.Event()
        self._ready: list[Any] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self.notes: list[str] = []

    def start(self, timeout: float = 120.0) -> None:
        for i in range(self.procs):
            ready = _CTX.Event()
            opts = WorkerOptions(
                record_starts=self.record,
                out_path=os.path.join(self._tmp, f"starts-{i}.json"),
                index=i,
                profile=self.profile,
            )
            p = _CTX.Process(
                target=_child,
                args=(
                    self.system,
                    self.dsn,
                    asdict(opts),
                    self._log_path(i),
                    ready,
                    self._go,
                    self._stop,
                ),
                name=f"{self.system}-worker-{i}",
                daemon=True,
            )
            p.start()
            self._ready.append(ready)
            self._procs.append(p)
        deadline = time.monotonic() + timeout
        for i, ready in enumerate(self._ready):
            proc = self._procs[i]
            while not ready.wait(0.05):
                if not proc.is_alive():
                    self.stop()
                    raise RuntimeError(
                        f"{proc.name} exited during start-up (code {proc.exitcode}):\n"
                        + self.log_tail(i)
                    )
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"{proc.name} not ready after {timeout}s")

    def _log_path(self, i: int) -> str:
        return os.path.join(self._tmp, f"worker-{i}.log")

    def log_tail(self, i: int, lines: int = 15) -> str:
        try:
            text = Path(self._log_path(i)).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> list[int]:
        """The worker processes' pids (for CPU accounting); for a system whose
        worker process runs its worker as a child (``worker_subprocess``), the
        children alive now too (a live child's time is not yet in its
        parent's cutime; once reaped it is, and its own pid reads 0)."""
        from benchmarks.adapters import SYSTEMS

        pids = [p.pid for p in self._procs if p.pid is not None]
        if SYSTEMS[self.system].worker_subprocess:
            pids += _children(pids)
        return pids

    def go(self) -> float:
        t0 = time.perf_counter()
        self._go.set()
        return t0

    def check_alive(self) -> None:
        for i, p in enumerate(self._procs):
            if not p.is_alive():
                raise RuntimeError(f"{p.name} died (exit code {p.exitcode}):\n{self.log_tail(i)}")

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._go.set()
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                self.notes.append(f"{p.name} did not stop within {timeout}s; terminated")
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
            elif p.exitcode not in (0, None):
                self.notes.append(
                    f"{p.name} exited with code {p.exitcode}: "
                    + self.log_tail(self._procs.index(p), 3).replace("\n", " | ")
                )

    def starts(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for f in sorted(Path(self._tmp).glob("starts-*.json")):
            for job_id, t in json.loads(f.read_text()):
                out.setdefault(int(job_id), float(t))
        return out

    def cleanup(self) -> None:
        for f in Path(self._tmp).glob("*"):
            f.unlink()
        os.rmdir(self._tmp)
