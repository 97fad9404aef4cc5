pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.factory",
    "tests.fixtures.dbstate",
    "tests.fixtures.workers",
    "tests.fixtures.pgbouncer",
]
