pytest_plugins = ["tests.fixtures.postgres"]
