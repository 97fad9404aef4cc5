"""Workflows: jobs that wait for other jobs.

``app.workflow(name)`` starts a graph that nothing is written for until
``enqueue()``; ``add`` returns a :class:`Step` that later steps name in
``after=``. The whole graph is one statement (``enqueue_graph``); releases
happen in the database, in the transaction that ends a dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgqueue.errors import InvalidInput
from pgqueue.models import JobSpec, WorkflowInfo, WorkflowRun, WorkflowStatus  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from pgqueue._adapters import ConnectionLike
    from pgqueue.app import App
    from pgqueue.task import Task

__all__ = ["Step", "Workflow", "WorkflowInfo", "WorkflowRun"]


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """One step of a :class:`Workflow` (what ``Workflow.add`` returns)."""

    workflow: Workflow = field(repr=False)
    index: int
    name: str
    spec: JobSpec = field(repr=False)
    after: tuple[Step, ...] = field(repr=False)
    allow_failed: bool


class Workflow:
    """A graph of steps; nothing is written until :meth:`enqueue`."""

    def __init__(self, app: App, name: str) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise InvalidInput(f"a workflow name is 1 to 255 characters, got {name!r}")
        self.app = app
        self.name = name
        self.steps: list[Step] = []
        self._names: set[str] = set()

    def add(
        self,
        task: Task[Any, Any] | str,
        payload: dict[str, Any] | None = None,
        *,
        after: Step | Sequence[Step] = (),
        name: str | None = None,
        allow_failed: bool = False,
        **options: Any,
    ) -> Step:
        """Add a step running ``task`` once every step in ``after`` succeeded
        (ended, with ``allow_failed=True``). ``options``: the enqueue options
        (``queue``, ``priority``, ``delay``, ``run_at``, ``max_attempts``,
        ``serial_key``, ``tags``, ``meta``, ...)."""
        task_name = task if isinstance(task, str) else task.name
        step_name = task_name if name is None else name
        if not isinstance(step_name, str) or not step_name:
            raise InvalidInput(f"a step name is a non-empty string, got {step_name!r}")
        if step_name in self._names:
            raise InvalidInput(
                f"workflow {self.name!r} already has a step named {step_name!r}: "
                "give this one name=..."
            )
        parents = (after,) if isinstance(after, Step) else tuple(after)
        for parent in parents:
            if not isinstance(parent, Step) or parent.workflow is not self:
                raise InvalidInput(
                    f"after= takes steps added earlier to workflow {self.name!r}, got {parent!r}"
                )
        for key in ("dedup_key", "dedup_window", "debounce", "depends_on", "payload", "task"):
            if options.get(key) is not None:
                raise InvalidInput(f"{key} is not an option of a workflow step")
        try:
            spec = JobSpec(task_name, payload, **options)
        except TypeError as exc:
            raise InvalidInput(f"unknown option for a workflow step: {exc}") from None
        step = Step(self, len(self.steps), step_name, spec, parents, bool(allow_failed))
        self.steps.append(step)
        self._names.add(step_name)
        return step

    def enqueue(self, *, conn: ConnectionLike | None = None) -> WorkflowRun:
        """Write every step in one statement (in ``conn``'s transaction when given)."""
        return self.app.enqueue_workflow(self, conn=conn)

    async def enqueue_async(self, *, conn: ConnectionLike | None = None) -> WorkflowRun:
        """Async twin of :meth:`enqueue`."""
        return await self.app.enqueue_workflow_async(self, conn=conn)
