"""The ``f:`` NOTIFY payload of a finished job is built in one place, the SQL
function ``finished_payload``, and parses as a ``finished`` event (the format
:mod:`pgqueue.events` documents); read from the SQL text itself: no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgqueue.events import JobEvent, parse
from pgqueue.models import JobStatus

SQL = Path(__file__).resolve().parents[2] / "sql"
FILES = [SQL / "schema.sql", *sorted((SQL / "queries").glob("*.sql"))]

# 'f:' then the pieces concatenated to it: columns or parameters (alias.column,
# p_name, with a ::text cast) and literals.
_VALUE = r"(?:\w+\.)?\w+(?:::text)?|'[^']*'"
_PAYLOAD = re.compile(rf"'f:'((?:\s*\|\|\s*(?:{_VALUE}))*)")
_PIECE = re.compile(rf"\|\|\s*({_VALUE})")
_FUNCTION = re.compile(r"CREATE FUNCTION \{schema\}\.(\w+)\(")

# What a column of the jobs table holds, for the check: a queue name may hold ':'.
SAMPLE = {"id": "4242", "queue": "emails:eu"}


def payload_sites() -> list[tuple[str, str, list[str]]]:
    """(file, the function around it, pieces) of each 'f:' payload in the SQL."""
    sites = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for match in _PAYLOAD.finditer(text):
            functions = _FUNCTION.findall(text, 0, match.start())
            where = functions[-1] if functions else "a query"
            sites.append((path.name, where, _PIECE.findall(match.group(1))))
    return sites


def render(pieces: list[str], status: JobStatus) -> str:
    out = "f:"
    for piece in pieces:
        if piece.startswith("'"):
            out += piece[1:-1]
        else:
            column = piece.removesuffix("::text").split(".")[-1].removeprefix("p_")
            out += str(status) if column == "status" else SAMPLE.get(column, f"<{column}>")
    return out


def test_finished_payloads_are_built_in_one_place() -> None:
    assert [(name, where) for name, where, _ in payload_sites()] == [
        ("schema.sql", "finished_payload")
    ]


def test_every_statement_that_announces_a_finish_uses_it() -> None:
    # ack, fail/retry, the reaper, the one cancel statement and a cascade's
    # cancels: if this drops, a path lost its announcement.
    text = "\n".join(path.read_text(encoding="utf-8") for path in FILES)
    assert text.count("{schema}.finished_payload(") >= 6


@pytest.mark.parametrize(
    ("where", "pieces"),
    [(f"{name}:{where}", pieces) for name, where, pieces in payload_sites()],
)
def test_every_finished_payload_parses(where: str, pieces: list[str]) -> None:
    for status in (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED):
        payload = render(pieces, status)
        assert parse(payload) == JobEvent("finished", "emails:eu", 4242, status), (
            f"{where} builds {payload!r}"
        )
