"""sql/schema.sql creates exactly what a database migrated to head has;
revisions are numbered in apply order; each SQL function has one current
definition, and it is the one in sql/schema.sql (docs/schema.md)."""

from __future__ import annotations

import re
from pathlib import Path

from alembic.script import ScriptDirectory

from pgqueue.schema import dump_file, dump_head, schema_file
from pgqueue.version import SCHEMA_REVISION

REPO = Path(__file__).resolve().parent.parent
CREATE_FUNCTION = re.compile(
    r"^CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(", re.MULTILINE | re.IGNORECASE
)


def _chain() -> list:  # type: ignore[type-arg]
    script = ScriptDirectory(str(REPO / "migrations"))
    return list(reversed(list(script.walk_revisions())))


def test_schema_file_matches_a_database_migrated_to_head(empty_db_dsn: str) -> None:
    assert dump_file(empty_db_dsn) == dump_head(empty_db_dsn), (
        "sql/schema.sql and the revisions disagree: `python -m pgqueue.schema check` shows how"
    )


def test_revisions_are_numbered_in_the_order_they_apply() -> None:
    chain = _chain()
    assert [r.revision for r in chain] == [f"{n:04d}" for n in range(1, len(chain) + 1)]
    assert chain[-1].revision == SCHEMA_REVISION
    for rev in chain:
        assert rev.path is not None
        assert Path(rev.path).name.startswith(f"{rev.revision}_"), rev.path
    files = sorted(p.name for p in (REPO / "migrations" / "versions").glob("*.py"))
    assert files == sorted(Path(r.path).name for r in chain if r.path)
    # SQL files of later revisions carry their revision's number.
    numbers = {r.revision for r in chain}
    for sql_file in (REPO / "sql" / "migrations").glob("*.sql"):
        assert sql_file.name[:4] in numbers, sql_file.name


def _definitions(text: str) -> dict[str, list[str]]:
    """Each function's definitions in ``text``: from its CREATE to the next statement."""
    starts = list(CREATE_FUNCTION.finditer(text))
    out: dict[str, list[str]] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = text[match.start() : end]
        body = re.split(r"\n(?=(?:CREATE|COMMENT|REVOKE|GRANT|ALTER|INSERT|DROP) )", body)[0]
        body = body.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION")
        out.setdefault(match.group(1), []).append(" ".join(body.split()))
    return out


def test_each_function_has_one_current_definition_in_schema_sql() -> None:
    """The rule of docs/schema.md: sql/schema.sql defines every function once;
    a revision after the baseline that changes a function carries its new
    body (CREATE OR REPLACE) in its .up.sql, and the last such body, in apply
    order, is the one sql/schema.sql shows. No other SQL file defines one."""
    current = _definitions(schema_file().read_text(encoding="utf-8"))
    assert current, "no function found in sql/schema.sql"
    assert {n: len(d) for n, d in current.items() if len(d) > 1} == {}
    last: dict[str, str] = {}
    for rev in _chain():
        up = REPO / "sql" / "migrations" / f"{Path(rev.path).stem}.up.sql"
        if up.exists():
            for name, bodies in _definitions(up.read_text(encoding="utf-8")).items():
                last[name] = bodies[-1]
    assert {n: b for n, b in last.items() if current.get(n, [None])[0] != b} == {}
    others = [
        str(p.relative_to(REPO))
        for p in (REPO / "sql").rglob("*.sql")
        if p != schema_file()
        and not p.name.endswith(".up.sql")
        and CREATE_FUNCTION.search(p.read_text())
    ]
    assert others == []
