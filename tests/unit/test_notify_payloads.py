"""Every ``f:`` NOTIFY payload the SQL can build parses as a ``finished``
event (the format :mod:`pgqueue.events` documents), read from the SQL text
itself: no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgqueue.events import JobEvent, parse
from pgqueue.models import JobStatus

SQL = Path(__file__).resolve().parents[2] / "sql"
FILES = [SQL / "schema.sql", *sorted((SQL / "queries").glob("*.sql"))]

# 'f:' then the pieces concatenated to it: columns (alias.column) and literals.
# An 'f:' chosen by a CASE is concatenated after its END.
_PAYLOAD = re.compile(r"'f:'(?:\s*END)?((?:\s*\|\|\s*(?:\w+\.\w+|'[^']*'))*)")
_PIECE = re.compile(r"\|\|\s*(\w+\.\w+|'[^']*')")

# What a column of the jobs table holds, for the check: a queue name may hold ':'.
SAMPLE = {"id": "4242", "queue": "emails:eu"}


def payload_sites() -> list[tuple[str, int, list[str]]]:
    """(file, line, pieces) of each 'f:' payload in the SQL."""
    sites = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for match in _PAYLOAD.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            sites.append((path.name, line, _PIECE.findall(match.group(1))))
    return sites


def render(pieces: list[str], status: JobStatus) -> str:
    out = "f:"
    for piece in pieces:
        if piece.startswith("'"):
            out += piece[1:-1]
        else:
            column = piece.split(".", 1)[1]
            out += str(status) if column == "status" else SAMPLE.get(column, f"<{column}>")
    return out


def test_the_sql_has_finished_payloads() -> None:
    # ack, fail/retry, the reaper and the one cancel statement: if this
    # drops, the regex lost them.
    assert len(payload_sites()) >= 4


@pytest.mark.parametrize(
    ("where", "pieces"),
    [(f"{name}:{line}", pieces) for name, line, pieces in payload_sites()],
)
def test_every_finished_payload_parses(where: str, pieces: list[str]) -> None:
    for status in (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED):
        payload = render(pieces, status)
        assert parse(payload) == JobEvent("finished", "emails:eu", 4242, status), (
            f"{where} builds {payload!r}"
        )
