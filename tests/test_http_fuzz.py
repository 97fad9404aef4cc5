"""#30 item 4: a property-based fuzz of the live ``pgqueue serve`` against
its own OpenAPI document (schemathesis): valid and invalid requests to every
operation; never a 500, every answer documented and shaped as documented,
invalid input refused. Bounded: a few examples per operation and mode."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pgqueue
from tests.http_support import Server, start_server
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES = int(
    os.environ.get("PGQUEUE_FUZZ_EXAMPLES", "15")
)  # per operation and mode: 13 operations x 2 modes, well under a minute
BUDGET_SECONDS = 60 if "PGQUEUE_FUZZ_EXAMPLES" not in os.environ else 3600


@pytest.fixture
def server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(db_dsn, tmp_path, roles, "--max-wait", "0.5")


def test_the_live_server_matches_its_openapi_document(server: Server, app: pgqueue.App) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import checks
    from schemathesis.generation import GenerationMode

    # Something to find: ids 1..3 exist, one leased, so acks can hit real rows.
    for n in range(3):
        app.enqueue("t", {"n": n})
    app.lease("default", "fuzz", max=1)

    schema = schemathesis.openapi.from_url(f"{server.url}/v1/openapi.json")
    headers = {"authorization": f"Bearer {server.tokens['admin']}"}
    chosen = [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
        checks.negative_data_rejection,
    ]
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize="PGQUEUE_FUZZ_EXAMPLES" not in os.environ,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case: schemathesis.Case) -> None:
                case.call_and_validate(
                    base_url=server.url, headers=headers, checks=chosen, timeout=30
                )

            try:
                fuzz()
            except Exception as exc:
                raise AssertionError(
                    f"{operation.label} ({mode.value}): {exc}\n"
                    f"server log: {server.log.read_text()[-3000:]}"
                ) from exc
    assert time.monotonic() - started < BUDGET_SECONDS
    assert "Traceback" not in server.log.read_text()
