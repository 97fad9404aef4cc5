"""An enqueue's defaults are decided in one SQL function, ``enqueue_resolve``:
the one-job path (``enqueue_job``) and the job-document path
(``enqueue_input``, under every batch function) both call it, and no other
function of sql/schema.sql decides the priority precedence or reads the task
registry's defaults for a new job."""

from __future__ import annotations

import re

from pgqueue.schema import schema_file

CREATE = re.compile(r"^CREATE FUNCTION \{schema\}\.(\w+)\(", re.MULTILINE)


def _bodies() -> dict[str, str]:
    text = schema_file().read_text(encoding="utf-8")
    starts = list(CREATE.finditer(text))
    return {
        m.group(1): text[m.start() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        for i, m in enumerate(starts)
    }


def test_both_enqueue_paths_resolve_through_enqueue_resolve() -> None:
    bodies = _bodies()
    for name in ("enqueue_job", "enqueue_input"):
        assert "{schema}.enqueue_resolve(" in bodies[name], name
    for name in ("enqueue_batch", "enqueue_rows", "enqueue_payloads"):
        assert "{schema}.enqueue_input(" in bodies[name], name


def test_priority_precedence_and_registry_defaults_are_decided_once() -> None:
    # The operator's priority setting, and the registry's defaults for a job.
    setting = re.compile(r"task_settings s\s+WHERE s\.priority IS NOT NULL")
    registry = re.compile(r"g\.(?:priority|max_attempts|lease_seconds|backoff)\b[^;]*?tasks g")
    deciders = {
        name
        for name, body in _bodies().items()
        if name.startswith("enqueue") and (setting.search(body) or registry.search(body))
    }
    assert deciders == {"enqueue_resolve"}


def test_no_insert_names_the_columns_of_a_new_job() -> None:
    """The columns an enqueue writes are listed once, in the type
    ``job_values`` (the view ``jobs_new`` is built from it): every function
    that creates jobs inserts through ``jobs_new`` and names no column."""
    bodies = _bodies()
    into_live = re.compile(r"INSERT INTO \{schema\}\.jobs_live\b")
    into_jobs = re.compile(r"INSERT INTO \{schema\}\.jobs\b")
    assert [name for name, body in bodies.items() if into_live.search(body)] == []
    assert [
        n for n, body in bodies.items() if n.startswith("enqueue") and into_jobs.search(body)
    ] == []
    inserts = re.findall(r"INSERT INTO \{schema\}\.jobs_new\b[^;]*", "".join(bodies.values()))
    assert len(inserts) == 5  # enqueue_job (2), enqueue_payloads, enqueue_rows, enqueue_batch
    for statement in inserts:
        assert re.match(r"INSERT INTO \{schema\}\.jobs_new AS j\s+SELECT ", statement), statement
        # A job_values expanded, or (enqueue_rows) the rows of a CTE that expands one.
        assert re.search(
            r"\.job\)\.\*|, r\.\*|SELECT i\.\* FROM input i|s\.\*\s+FROM shared s", statement
        ), statement
    assert "v.payload, (v.job).*" in bodies["enqueue_rows"]
    assert "shared AS MATERIALIZED (SELECT (v_job).*)" in bodies["enqueue_payloads"]
    view = schema_file().read_text(encoding="utf-8")
    assert "CREATE VIEW {schema}.jobs_new AS SELECT id, payload, %s, stage" in view
