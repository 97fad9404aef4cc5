pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.factory",
    "tests.fixtures.dbstate",
    "tests.fixtures.workers",
    "tests.fixtures.pgbouncer",
]

# --- the fast tier ----------------------------------------------------------------
# `python -m pytest -m fast` runs, in seconds, every test that needs no PostgreSQL:
# the I/O-free operations of pgqueue/ops driven with canned rows, parsers,
# validation, rendering, the SQL files read as text. A test is in it when no
# database fixture is in its closure, so a new test of that kind joins by itself.

import pytest  # noqa: E402

#: Fixtures that reach a PostgreSQL server (every database fixture depends on one).
_DATABASE_FIXTURES = frozenset({"pg_server_dsn", "cluster"})
#: Database-free tests that still take a second or more: they start an
#: interpreter (the console script, a fresh ``import pgqueue``), mypy, or an
#: embedded server. A module name stands for all of its tests.
_SLOW_WITHOUT_DATABASE = frozenset(
    {
        "test_cli_newcomer.py",
        "test_embedded.py",
        "test_typed_api.py",
        "test_worker_speed.py",
        "test_harness.py",
        "test_logs.py",
        "test_migrations.py",
        "test_benchmark_statements.py",
        "test_cli_bad_input.py::test_wrong_dsn_through_the_console_script",
        "test_cli_commands.py::test_version_and_help",
        "test_dashboard.py::test_cli_rejects_a_bad_base_path_before_connecting",
        "test_dashboard.py::test_cli_without_the_extra_keeps_working_and_imports_nothing_of_it",
        "test_security_least_privilege.py::test_a_malformed_dsn_is_never_echoed",
        "test_security_least_privilege.py::test_migrate_without_a_server_is_one_line",
        "test_tracing.py::test_import_pgqueue_imports_no_extra",
    }
)


def _slow_without_database(item: pytest.Item) -> bool:
    function = getattr(item, "originalname", item.name)
    return bool({item.path.name, f"{item.path.name}::{function}"} & _SLOW_WITHOUT_DATABASE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (
            _DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            and not _slow_without_database(item)
            and item.get_closest_marker("slow") is None
            and item.get_closest_marker("chaos") is None
        ):
            item.add_marker(pytest.mark.fast)
