"""run_worker's options become WorkerSettings the same way for an App and a Router."""

from __future__ import annotations

import pytest

from pgqueue.worker.settings import for_app


@pytest.mark.parametrize("listen_dsn", [None, "postgresql:///x"])
@pytest.mark.parametrize("requested", [None, True, False])
def test_listen_is_what_was_asked_and_possible(
    listen_dsn: str | None, requested: bool | None
) -> None:
    options = {} if requested is None else {"listen": requested}
    settings = for_app(listen_dsn, ["a"], options)
    assert settings.listen is (listen_dsn is not None and requested is not False)
    assert options == ({} if requested is None else {"listen": requested})  # not consumed
