"""``pgqueue serve`` as a real process for the HTTP API tests: a token file
with one token per kind, roles granted with ``pgqueue grant`` (recorded, so
the server finds them), and a client that knows the tokens."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.fixtures.cluster import free_port
from tests.test_security_grants import Roles

KINDS = ("producer", "worker", "admin")


@dataclass
class Server:
    url: str
    tokens: dict[str, str]  # kind (and 'worker-b', a second worker) -> token
    roles: dict[str, str]  # kind -> database role
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, kind: str | None = None, timeout: float = 30.0) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.tokens[kind]}"} if kind else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def async_client(self, kind: str, timeout: float = 30.0) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {self.tokens[kind]}"}
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, limits=limits)


def _limit_files(count: int) -> None:
    """In the child: at most ``count`` open file descriptors (``ulimit -n``)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def write_tokens(path: Path) -> dict[str, str]:
    tokens = {kind: f"{kind}-{uuid.uuid4().hex}" for kind in KINDS}
    tokens["worker-b"] = f"worker-b-{uuid.uuid4().hex}"  # a second worker's token
    lines = ["# kind sha256(token)"]
    lines += [
        f"{kind.split('-')[0]} {hashlib.sha256(t.encode()).hexdigest()}"
        for kind, t in tokens.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return tokens


def start_server(
    dsn: str,
    tmp_path: Path,
    roles: Roles,
    *extra: str,
    grant: bool = True,
    open_files: int | None = None,
    upkeep: bool = False,
    port: int | None = None,
    tokens: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Grant a role per kind, start ``pgqueue serve`` and wait until it answers.
    Without ``upkeep`` the server neither reaps nor maintains: tests that
    compare the database before and after a request want no other writer."""
    granted = (
        {kind: roles.create(dsn, f"pgq_http_{kind[:4]}", kind=kind).name for kind in KINDS}
        if grant
        else {}
    )
    if tokens is None:
        tokens = write_tokens(tmp_path / "tokens")
    port = port or free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "PGQUEUE_DSN": dsn}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pgqueue_cli", "serve", "--tokens", str(tmp_path / "tokens"),
             "--port", str(port), "--log-level", "warning",
             *(() if upkeep else ("--no-reaper", "--no-maintenance")), *extra],
            stdout=out, stderr=subprocess.STDOUT, env=env,
            preexec_fn=None if open_files is None else partial(_limit_files, open_files),
        )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", tokens, granted, process, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"pgqueue serve exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{server.url}/v1/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"pgqueue serve did not answer: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
