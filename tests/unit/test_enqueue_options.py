"""The enqueue options are described once: :class:`pgqueue.JobSpec` (type,
default, meaning). The typed keyword form (:class:`EnqueueOptions`), the
keyword signatures that take it, the CLI and the op that checks each option
follow it; these tests fail when one of them is left out of an added option."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, get_type_hints

import pytest

import pgqueue
from pgqueue.models import EnqueueOptions, JobSpec

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = [f for f in JobSpec._fields if f not in ("task", "payload")]


def test_enqueue_options_are_jobspec_options_with_the_same_types() -> None:
    spec = get_type_hints(JobSpec)
    typed = get_type_hints(EnqueueOptions)
    assert list(typed) == OPTIONS
    assert typed == {name: spec[name] for name in OPTIONS}
    assert EnqueueOptions.__total__ is False  # every option may be left out


@pytest.mark.parametrize(
    "method",
    [
        pgqueue.App.enqueue,
        pgqueue.App.enqueue_async,
        pgqueue.Task.with_options,
    ],
    ids=lambda m: m.__qualname__,
)
def test_keyword_signatures_take_the_options_from_the_model(method: Any) -> None:
    """No option is written out again: the method takes ``conn`` and
    ``**options: Unpack[EnqueueOptions]``."""
    params = inspect.signature(method).parameters
    keyword = {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(keyword) == {"conn"}
    (var,) = [p for p in params.values() if p.kind is p.VAR_KEYWORD]
    assert var.annotation in ("Unpack[EnqueueOptions]",), var.annotation


def test_every_option_reaches_jobspec_through_the_app() -> None:
    """``App.enqueue``'s options become the JobSpec fields of the same name."""
    seen: list[JobSpec] = []

    class Recorder(pgqueue.App):
        def enqueue_spec(self, spec: JobSpec, *, conn: Any = None) -> Any:
            seen.append(spec)
            return pgqueue.Enqueued(1, True)

    app = Recorder(dsn="postgresql://nowhere.invalid/x")
    values = {name: object() for name in OPTIONS}
    app.enqueue("t", {"a": 1}, **values)  # type: ignore[arg-type]
    assert seen == [JobSpec("t", {"a": 1}, **values)]  # type: ignore[arg-type]
    task = app.task(name="t2")(lambda: None)
    assert task.with_options(**values).spec == JobSpec("t2", None, **values)  # type: ignore[arg-type]


def test_the_cli_enqueue_command_shows_every_option() -> None:
    from pgqueue_cli.enqueue import enqueue

    cli_names = set(inspect.signature(enqueue).parameters)
    # The one renamed flag: --tag, repeated, is the option tags.
    assert {"tag" if name == "tags" else name for name in OPTIONS} <= cli_names


def test_every_option_is_checked_by_the_enqueue_op() -> None:
    """Each option is read (and so checked) by ``ops/enqueue.py`` or, for the
    dependency options, ``ops/workflows.py``."""
    source = "".join(
        (ROOT / "pgqueue" / "ops" / name).read_text() for name in ("enqueue.py", "workflows.py")
    )
    unread = [name for name in OPTIONS if not re.search(rf"\bspec\.{name}\b", source)]
    assert unread == []
