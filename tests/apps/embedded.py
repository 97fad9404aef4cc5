"""A service that embeds the worker: ``python -m tests.apps.embedded``.

Runs ``app.run_worker(...)`` (blocking, with its own SIGTERM/SIGINT handling)
on the App of :mod:`tests.apps.tasks`.
"""

from tests.apps.tasks import app

if __name__ == "__main__":
    app.run_worker(concurrency=2, poll_interval=0.5, shutdown_timeout=10, log_format="json")
