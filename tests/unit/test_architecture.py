"""ARCHITECTURE.md against the tree: its "Every module" section names every
module of the library, the CLI and the pytest plugin and nothing else,
every file path it names anywhere exists, and the one rule of its list that
no other test held (one cancel statement) holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "ARCHITECTURE.md"
SECTION = "## Every module"
#: The packages whose modules the section names.
PACKAGES = ("pgqueue", "cli/pgqueue_cli", "pgqueue_pytest")
#: Inside a package: Django's migrations, one per schema revision, not modules
#: with a job of their own.
SKIPPED = ("contrib/django/migrations/",)

# A module line of the section: "- `path/to/module.py` — its one job."
MODULE_LINE = re.compile(r"^- `([^`]+\.py)`", re.MULTILINE)
# A file path anywhere on the page: a backticked name with a folder, ending
# in .py, .sql or .md (globs such as `pgqueue/ops/*.py` name a folder).
PATH = re.compile(r"`([\w./-]+/[\w.*-]+\.(?:py|sql|md))`")


def section(text: str, heading: str = SECTION) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    start = text.find(f"\n{heading}\n")
    if start < 0:
        raise AssertionError(f"ARCHITECTURE.md has no {heading!r} section")
    level = heading.split(" ")[0]
    rest = text[start + len(heading) + 2 :]
    following = re.search(rf"^{level} ", rest, re.MULTILINE)
    return rest[: following.start()] if following else rest


def named_modules(text: str) -> list[str]:
    return MODULE_LINE.findall(section(text))


def tree_modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """Every module of ``packages`` under ``root``: not the ``__init__.py``
    files (unless it is its package's only module) nor Django's migrations.
    Fails when a package is missing, so the check never passes on nothing."""
    found: set[str] = set()
    for package in packages:
        folder = root / package
        if not folder.is_dir():
            raise AssertionError(f"no package to list: {folder} is missing")
        paths = [
            p.relative_to(root).as_posix()
            for p in folder.rglob("*.py")
            if not p.relative_to(folder).as_posix().startswith(SKIPPED)
        ]
        modules = {p for p in paths if not p.endswith("__init__.py")}
        found |= modules or set(paths)
    return found


def differences(text: str, root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """What the section and the tree disagree on, one line each."""
    named = named_modules(text)
    tree = tree_modules(root, packages)
    problems = [
        f"named twice on the page: {p}" for p in sorted({p for p in named if named.count(p) > 1})
    ]
    problems += [f"not on the page: {p}" for p in sorted(tree - set(named))]
    problems += [f"named on the page, not in the tree: {p}" for p in sorted(set(named) - tree)]
    return problems


def missing_paths(text: str, root: Path) -> list[str]:
    """Every file path the page names (a glob: its folder) that does not
    exist, from the repository's root or, the page's shorthand for the
    library's own files (`worker/parts.py`), from ``pgqueue/``."""
    missing = []
    for path in sorted(set(PATH.findall(text))):
        target = path.rsplit("/", 1)[0] if "*" in path else path
        if not any((root / base / target).exists() for base in ("", "pgqueue")):
            missing.append(path)
    return missing


# --- the page and the tree ------------------------------------------------------------


def test_the_page_names_every_module_of_the_tree_and_no_other() -> None:
    assert differences(PAGE.read_text(encoding="utf-8"), ROOT) == []


def test_every_path_the_page_names_exists() -> None:
    assert missing_paths(PAGE.read_text(encoding="utf-8"), ROOT) == []


def test_every_module_line_says_its_job() -> None:
    lines = [
        line
        for line in section(PAGE.read_text(encoding="utf-8")).splitlines()
        if MODULE_LINE.match(line)
    ]
    assert [line for line in lines if not re.match(r"^- `[^`]+` — \S", line)] == []


# --- the check itself can fail --------------------------------------------------------

PLANTED_PAGE = """# Architecture

See `pkg/core.py` and `tests/unit/test_gone.py`; the ops are `pkg/ops/*.py`.

## Every module

- `pkg/core.py` — the core.
- `pkg/gone.py` — deleted since.
- `pkg/ops/read.py` — a read.
- `pkg/ops/read.py` — a read, again.
- `plugin/__init__.py` — the plugin.

## Tests

- `pkg/ops/new.py` — named outside the section: does not count.
"""


def _plant(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text('"""A module."""\n', encoding="utf-8")


def test_a_module_missing_from_the_page_or_the_tree_fails(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        [
            "pkg/__init__.py",
            "pkg/core.py",
            "pkg/ops/__init__.py",
            "pkg/ops/read.py",
            "pkg/ops/new.py",
            "pkg/contrib/django/migrations/0001_initial.py",
            "plugin/__init__.py",
        ],
    )
    found = differences(PLANTED_PAGE, tmp_path, ("pkg", "plugin"))
    assert found == [
        "named twice on the page: pkg/ops/read.py",
        "not on the page: pkg/ops/new.py",
        "named on the page, not in the tree: pkg/gone.py",
    ]


def test_a_missing_package_or_section_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="missing"):
        tree_modules(tmp_path, ("absent",))
    with pytest.raises(AssertionError, match="no '## Every module' section"):
        named_modules("# Architecture\n\n## Modules\n\n- `pkg/core.py` — the core.\n")


def test_a_named_path_that_does_not_exist_fails(tmp_path: Path) -> None:
    _plant(tmp_path, ["pkg/core.py", "pkg/ops/read.py", "plugin/__init__.py"])
    assert missing_paths(PLANTED_PAGE, tmp_path) == [
        "pkg/gone.py",
        "pkg/ops/new.py",
        "tests/unit/test_gone.py",
    ]


# --- a rule of the page that no other test held: one cancel statement ----------------
#
# An operator's cancel (``app.cancel``, ``cancel_many``, ``cancel_workflow``, the
# CLI, the dashboard) is the statement ``job_cancel``: no other named statement
# asks a running job to stop or ends live jobs cancelled, and only the cancel
# ops yield it. (Jobs also end cancelled inside the SQL functions, when a
# cancelled attempt ends or a workflow's dependency fails: outcomes, not cancels.)
CANCEL_OPS = frozenset({"pgqueue/ops/operator.py", "pgqueue/ops/workflows.py"})
CANCELS = re.compile(r"cancel_requested\s*=\s*true|'cancelled'::", re.IGNORECASE)
STATEMENT = re.compile(r"^-- name: (\w+)\n", re.MULTILINE)


def cancelling_statements(folder: Path) -> set[str]:
    """Names of the statements under ``folder`` that cancel jobs."""
    found: set[str] = set()
    for path in sorted(folder.glob("*.sql")):
        pieces = STATEMENT.split(path.read_text(encoding="utf-8"))[1:]  # name, body, ...
        bodies = zip(pieces[::2], pieces[1::2], strict=True)
        found |= {name for name, body in bodies if CANCELS.search(body)}
    return found


def yielders(root: Path, statement: str) -> set[str]:
    """Modules of ``pgqueue/`` that name ``statement`` (not its declaration)."""
    return {
        path.relative_to(root).as_posix()
        for path in (root / "pgqueue").rglob("*.py")
        if path.name != "queries.py" and f'"{statement}"' in path.read_text(encoding="utf-8")
    }


def test_one_statement_cancels_and_only_the_cancel_ops_run_it() -> None:
    assert cancelling_statements(ROOT / "sql" / "queries") == {"job_cancel"}
    assert yielders(ROOT, "job_cancel") == CANCEL_OPS


def test_a_second_cancel_statement_or_caller_is_found(tmp_path: Path) -> None:
    queries = tmp_path / "sql" / "queries"
    queries.mkdir(parents=True)
    (queries / "operator.sql").write_text(
        "-- name: job_cancel\nUPDATE {schema}.jobs_live SET cancel_requested = true;\n\n"
        "-- name: job_count\nSELECT count(*) FROM {schema}.jobs_live;\n",
        encoding="utf-8",
    )
    (queries / "dashboard.sql").write_text(
        "-- name: dashboard_cancel_all\n"
        "SELECT {schema}.finish_jobs(ids, '{queued}', 'cancelled'::{schema}.job_status);\n",
        encoding="utf-8",
    )
    assert cancelling_statements(queries) == {"job_cancel", "dashboard_cancel_all"}
    _plant(tmp_path, ["pgqueue/ops/operator.py", "pgqueue/queries.py"])
    (tmp_path / "pgqueue/dashboard/data.py").parent.mkdir(parents=True)
    (tmp_path / "pgqueue/dashboard/data.py").write_text(
        'rows = yield Execute("job_cancel", {})\n', encoding="utf-8"
    )
    (tmp_path / "pgqueue/queries.py").write_text(
        'QueryName = Literal["job_cancel"]\n', encoding="utf-8"
    )
    assert yielders(tmp_path, "job_cancel") == {"pgqueue/dashboard/data.py"}
