"""#44: restarting ``pgqueue serve`` without an outage, by systemd socket
activation. The test plays systemd: it holds the listening socket and hands
it (``LISTEN_FDS``) to one server, then to the next after SIGTERM. A client
enqueuing all along is never refused: connections made while no server runs
wait in the socket's backlog."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import pgqueue
from tests.http_support import write_tokens
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

# systemd sets LISTEN_PID to the service's pid: the shell's, kept by exec.
ACTIVATE = 'export LISTEN_PID=$$ LISTEN_FDS=1; exec "$@"'


def activated_server(
    dsn: str, listener: socket.socket, tokens: Path, log: Path
) -> subprocess.Popen[bytes]:
    fd = listener.fileno()
    with log.open("ab") as out:
        return subprocess.Popen(
            ["sh", "-c", ACTIVATE, "sh", sys.executable, "-m", "pgqueue_cli", "serve",
             "--tokens", str(tokens), "--log-level", "warning", "--no-reaper",
             "--no-maintenance"],
            env={**os.environ, "PGQUEUE_DSN": dsn}, stdout=out, stderr=subprocess.STDOUT,
            pass_fds=(3,), preexec_fn=lambda: os.dup2(fd, 3),
        )  # fmt: skip


def wait_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/v1/openapi.json", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the activated server did not answer: {log.read_text()[-2000:]}")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    yield sock
    sock.close()


def test_a_restart_by_socket_activation_refuses_no_client(
    db_dsn: str, tmp_path: Path, listener: socket.socket, app: pgqueue.App
) -> None:
    tokens = write_tokens(tmp_path / "tokens")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    log = tmp_path / "serve.log"
    first = activated_server(db_dsn, listener, tmp_path / "tokens", log)
    second: subprocess.Popen[bytes] | None = None
    outcomes: dict[str, int] = {"created": 0}
    errors: list[str] = []
    stop = threading.Event()

    def client() -> None:
        headers = {"authorization": f"Bearer {tokens['producer']}", "connection": "close"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            n = 0
            while not stop.is_set():
                try:
                    answer = http.post("/v1/jobs", json={"task": "t", "payload": {"n": n}})
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                    continue
                assert answer.status_code == 201, answer.text
                outcomes["created"] += 1
                n += 1

    try:
        wait_answering(url, first, log)
        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(1.0)
        before = outcomes["created"]
        first.send_signal(signal.SIGTERM)
        first.wait(30)
        # Uvicorn re-raises the SIGTERM it handled once shut down.
        assert first.returncode in (0, -signal.SIGTERM), log.read_text()
        second = activated_server(db_dsn, listener, tmp_path / "tokens", log)
        deadline = time.monotonic() + 60
        while outcomes["created"] < before + 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        thread.join(60)
    finally:
        stop.set()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
    # Served before and after the restart; nothing refused, reset or lost.
    assert outcomes["created"] >= before + 20, log.read_text()[-2000:]
    assert errors == []
    assert app.metrics()["default"].queued == outcomes["created"]
    text = log.read_text()
    assert "Traceback" not in text, text[-2000:]


def test_no_systemd_socket_without_listen_pid(monkeypatch: Any) -> None:
    from pgqueue_cli.serve import systemd_sockets

    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))  # another process's
    assert systemd_sockets() is None
    monkeypatch.delenv("LISTEN_PID")
    assert systemd_sockets() is None
