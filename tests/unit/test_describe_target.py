"""Error messages name the server a DSN points at, never its password:
``describe_target`` for single and multi-host (failover) DSNs."""

from __future__ import annotations

import pytest

from pgqueue.connection import describe_target


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:secret@db1:5433/shop", "db1:5433/shop"),
        ("postgresql://u@db1,db2/shop", "db1:5432,db2:5432/shop"),
        ("postgresql://u@db1:5432,db2:6543/shop", "db1:5432,db2:6543/shop"),
        ("host=db1,db2 port=5433 dbname=shop user=u", "db1:5433,db2:5433/shop"),
        ("host=db1,db2 port=,6000 dbname=shop user=u", "db1:5432,db2:6000/shop"),
    ],
)
def test_each_host_is_paired_with_its_port(
    dsn: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPORT", raising=False)
    assert describe_target(dsn) == shown
    assert "secret" not in describe_target(dsn)
