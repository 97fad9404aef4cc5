"""``pgqueue task``: live task settings, per-task limits and run statistics,
and ``pgqueue tasks`` (the tasks an App registers / live workers run)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

import pgqueue
from pgqueue_cli import output
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption
from pgqueue_cli.parsing import duration

app = typer.Typer(
    name="task",
    help="Per-task settings, limits and statistics, applied by every worker without a restart.",
    no_args_is_help=True,
)

TaskArgument = Annotated[str, typer.Argument(metavar="TASK", help="The task's name.")]


@app.command("set")
def set_(
    task: TaskArgument,
    max_attempts: Annotated[
        int | None, typer.Option("--max-attempts", help="Attempts before dead; 0: unlimited.")
    ] = None,
    timeout: Annotated[
        str | None, typer.Option(help="Time a run may take, e.g. 30s or 5m.")
    ] = None,
    lease: Annotated[
        str | None, typer.Option("--lease", help="Lease length of each attempt, e.g. 2m.")
    ] = None,
    priority: Annotated[
        int | None, typer.Option(help="Priority of jobs enqueued without one (higher first).")
    ] = None,
    backoff: Annotated[
        str | None,
        typer.Option(help="Retry backoff as BASE,FACTOR,MAX[,JITTER] in seconds, e.g. 5,2,600."),
    ] = None,
    unset: Annotated[
        list[str] | None,
        typer.Option(
            "--unset",
            help="Go back to the code's default for a field: max_attempts, timeout, "
            "lease_seconds, priority or retry (repeatable).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Override a task's settings for every worker, from its next lease.

    Fields not given keep their setting; --unset returns one to the code's
    default. With --json: the task as `task show --json` prints it.

    Examples:

      pgqueue task set send_email --timeout 30s --max-attempts 10

      pgqueue task set send_email --unset timeout
    """
    retry = _backoff(backoff) if backoff is not None else None
    with open_app() as task_app:
        task_app.set_task_options(
            task,
            max_attempts=max_attempts,
            timeout=duration("--timeout", timeout).total_seconds() if timeout else None,
            lease_seconds=duration("--lease", lease).total_seconds() if lease else None,
            priority=priority,
            retry=retry,
            unset=unset or (),
        )
        info = task_app.get_task(task)
    _show(info, as_json, f"task {task!r} settings saved")


@app.command()
def limit(
    task: TaskArgument,
    concurrency: Annotated[
        int | None,
        typer.Option(help="At most this many jobs of the task running at once, over all workers."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(help="At most COUNT/PERIOD lease starts per sliding window, e.g. 100/1m."),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Lift the limits not given in this command.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Limit a task across all workers; other tasks of its queue are not held back.

    A limit not given is kept; --clear lifts the limits not given.

    Examples:

      pgqueue task limit resize_image --concurrency 2

      pgqueue task limit call_api --rate 100/1m

      pgqueue task limit resize_image --clear
    """
    with open_app() as task_app:
        before = _known(task_app, task)
        now = before.settings if before is not None else pgqueue.TaskSettings()
        task_app.set_task_limit(
            task,
            concurrency=concurrency if concurrency is not None or clear else now.concurrency,
            rate=rate if rate is not None or clear else now.rate,
        )
        info = _known(task_app, task)
    if info is None:
        output.info(f"task {task!r}: no limits")
        return
    _show(info, as_json, f"task {task!r} limits set")


@app.command()
def show(task: TaskArgument, as_json: JsonOption = False) -> None:
    """Show a task: declared defaults, live settings, limits, workers that have it.

    Examples:

      pgqueue task show send_email --json
    """
    with open_app() as task_app:
        info = task_app.get_task(task)
    _show(info, as_json, None)


@app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """List the tasks published by workers or with settings.

    Examples:

      pgqueue task list
    """
    with open_app() as task_app:
        infos = task_app.list_tasks()
    if as_json:
        output.print_json(infos)
        return
    output.stdout().print(_table(infos))


@app.command()
def stats(
    task: Annotated[
        str | None, typer.Argument(metavar="[TASK]", help="One task (default: all).")
    ] = None,
    since: Annotated[
        str, typer.Option(help="Window: jobs and attempts finished in the last 24h, 1h, 7d, ...")
    ] = "24h",
    as_json: JsonOption = False,
) -> None:
    """Run statistics per task: runs, outcomes, retries, duration and wait percentiles.

    With --json: {task: {runs, succeeded, failed, dead, cancelled, retries,
    duration_p50, duration_p95, duration_max, wait_p50, wait_p95, wait_max,
    last_error}}.

    Examples:

      pgqueue task stats --since 1h

      pgqueue task stats send_email --json
    """
    window = duration("--since", since)
    with open_app() as task_app:
        result = task_app.task_stats(task, since=window)
    if as_json:
        output.print_json(result)
        return
    rows = [
        (
            s.task,
            s.runs,
            s.succeeded,
            s.failed,
            s.dead,
            s.retries,
            _secs(s.duration_p50),
            _secs(s.duration_p95),
            _secs(s.duration_max),
            _secs(s.wait_p50),
            _secs(s.wait_p95),
            output.shorten(s.last_error, 50),
        )
        for s in result.values()
    ]
    columns = (
        "task",
        "runs",
        "succeeded",
        "failed",
        "dead",
        "retries",
        "p50",
        "p95",
        "max",
        "wait p50",
        "wait p95",
        "last error",
    )
    output.stdout().print(output.table(f"tasks, last {since}", columns, rows))


def tasks(
    app_path: Annotated[
        str | None,
        typer.Option("--app", envvar="PGQUEUE_APP", help="Also list the tasks this App registers."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List tasks: registered in the App (--app) and seen by live workers.

    With --json: a list of {name, registered, queue, workers, settings}.

    Examples:

      pgqueue tasks --app myproject.tasks:app
    """
    registered: dict[str, Any] = {}
    if app_path:
        from pgqueue_cli.apps import load_app

        loaded: Any = load_app(app_path)
        apps = loaded.apps.values() if isinstance(loaded, pgqueue.Router) else [loaded]
        for one in apps:
            registered.update(one.tasks)
    with open_app() as task_app:
        known = {info.name: info for info in task_app.list_tasks()}
    names = sorted(set(registered) | set(known))
    entries: list[dict[str, Any]] = [
        {
            "name": name,
            "registered": name in registered,
            "queue": registered[name].queue if name in registered else known[name].queue,
            "workers": known[name].workers if name in known else [],
            "settings": known[name].settings if name in known else pgqueue.TaskSettings(),
        }
        for name in names
    ]
    if as_json:
        output.print_json(entries)
        return
    rows = [
        (
            e["name"],
            e["queue"],
            "yes" if e["registered"] else "no",
            len(e["workers"]),
            _settings_text(e["settings"]),
        )
        for e in entries
    ]
    output.stdout().print(
        output.table(None, ("task", "queue", "in app", "live workers", "settings"), rows)
    )
    if not entries:
        output.hint("no tasks: give --app, or start a worker (workers publish their tasks)")


# --- helpers -------------------------------------------------------------------


def _known(task_app: pgqueue.App, task: str) -> pgqueue.TaskInfo | None:
    try:
        return task_app.get_task(task)
    except pgqueue.TaskNotFound:
        return None


def _backoff(text: str) -> pgqueue.Backoff:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise pgqueue.InvalidOption(
            f"--backoff must be BASE,FACTOR,MAX[,JITTER] in seconds, got {text!r}"
        ) from None
    if len(values) not in (3, 4):
        raise pgqueue.InvalidOption(
            f"--backoff must be BASE,FACTOR,MAX[,JITTER] in seconds, got {text!r}"
        )
    return pgqueue.Backoff(*values)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _settings_text(s: pgqueue.TaskSettings) -> str:
    parts = []
    if s.max_attempts is not None:
        parts.append(f"max_attempts={s.max_attempts or 'unlimited'}")
    if s.timeout is not None:
        parts.append(f"timeout={s.timeout:g}s")
    if s.lease_seconds is not None:
        parts.append(f"lease={s.lease_seconds}s")
    if s.priority is not None:
        parts.append(f"priority={s.priority}")
    if s.retry is not None:
        parts.append("backoff=" + ",".join(f"{v:g}" for v in s.retry))
    if s.concurrency is not None:
        parts.append(f"concurrency<={s.concurrency}")
    if s.rate is not None:
        parts.append(f"rate<={s.rate}")
    return " ".join(parts) or "-"


def _table(infos: list[pgqueue.TaskInfo]) -> Any:
    rows = [
        (
            i.name,
            i.queue or "-",
            "-" if i.max_attempts is None else (i.max_attempts or "unlimited"),
            i.running,
            len(i.workers),
            output.fmt_time(i.last_seen_at),
            _settings_text(i.settings),
        )
        for i in infos
    ]
    return output.table(
        None,
        ("task", "queue", "max attempts", "running", "live workers", "last seen", "settings"),
        rows,
    )


def _show(info: pgqueue.TaskInfo, as_json: bool, done: str | None) -> None:
    if as_json:
        output.print_json(info)
        return
    if done:
        output.info(done)
    declared = (
        f"queue {info.queue!r}, priority {info.priority}, max_attempts "
        f"{info.max_attempts or 'unlimited'}, lease {info.lease_seconds}s, timeout "
        f"{'none' if info.timeout is None else f'{info.timeout:g}s'}"
        if info.queue is not None
        else "not published by any worker yet"
    )
    output.info(f"task {info.name!r}")
    output.info(f"  declared: {declared}")
    output.info(f"  settings: {_settings_text(info.settings)}")
    output.info(f"  running:  {info.running}")
    output.info(f"  live workers: {', '.join(info.workers) or 'none'}")
