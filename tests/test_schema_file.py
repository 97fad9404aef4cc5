"""sql/schema.sql is the schema a database migrated to head has; revisions are
numbered in apply order; each SQL function is defined in one file."""

from __future__ import annotations

import re
from pathlib import Path

from alembic.script import ScriptDirectory

from pgqueue.schema import dump_head, schema_file
from pgqueue.version import SCHEMA_REVISION

REPO = Path(__file__).resolve().parent.parent
CREATE_FUNCTION = re.compile(
    r"^CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(", re.MULTILINE | re.IGNORECASE
)


def test_schema_file_matches_a_database_migrated_to_head(empty_db_dsn: str) -> None:
    dumped = dump_head(empty_db_dsn)
    on_disk = schema_file().read_text(encoding="utf-8")
    assert dumped == on_disk, "run `python -m pgqueue.schema dump --write`, commit sql/schema.sql"


def test_revisions_are_numbered_in_the_order_they_apply() -> None:
    script = ScriptDirectory(str(REPO / "migrations"))
    chain = [r for r in reversed(list(script.walk_revisions()))]
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


def test_each_function_is_defined_in_one_file() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "sql").rglob("*.sql")):
        for name in CREATE_FUNCTION.findall(path.read_text(encoding="utf-8")):
            seen.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert seen, "no function found in sql/"
    assert {n: f for n, f in seen.items() if len(f) > 1} == {}
