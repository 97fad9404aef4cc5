"""``pgqueue schedule``: cron schedules stored in the database.

Every worker running the scheduler (the default) fires them; each fire time
enqueues exactly one job, whose run_at is that fire time.
"""

from __future__ import annotations

from typing import Annotated, Any
from zoneinfo import ZoneInfo

import typer

import pgqueue
from pgqueue.commands import command
from pgqueue.errors import DuplicateSchedule
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption

app = typer.Typer(
    name="schedule",
    help="Cron schedules: add, list, enable, disable, remove, run now.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


@app.command()
def add(
    name: NameArgument,
    cron: Annotated[
        str,
        typer.Option(
            "--cron",
            help="5 fields (minute hour day month weekday), or 6 with seconds last; "
            "or @hourly, @daily, @weekly, @monthly, @yearly.",
        ),
    ],
    task: Annotated[str, typer.Option("--task", help="The task name the jobs run.")],
    payload: Annotated[
        str | None, typer.Option(help="The jobs' payload, a JSON object.", show_default=False)
    ] = None,
    queue: Annotated[
        str | None, typer.Option(help="Queue of the jobs (default: the task's queue).")
    ] = None,
    tz: Annotated[
        str, typer.Option("--tz", help="IANA time zone the cron expression is read in.")
    ] = "UTC",
    priority: Annotated[
        int | None, typer.Option(help="Priority of the jobs (default: the task's).")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Attempts per job (default: the task's).")
    ] = None,
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Store it disabled (enable it later).")
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite a schedule of the same name.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Add a cron schedule (an existing name is an error unless --replace).

    With --json: the Schedule.

    Examples:

      pgqueue schedule add nightly-report --cron "30 2 * * *" --tz Europe/Berlin --task report

      pgqueue schedule add heartbeat --cron "* * * * * */10" --task ping --payload '{"n": 1}'
    """
    body = parsing.json_object(payload, "--payload") if payload is not None else None
    with open_app() as schedule_app:
        if not replace and name in {s.name for s in schedule_app.list_schedules()}:
            raise DuplicateSchedule(
                f"a schedule named {name!r} already exists: pass --replace to overwrite it, "
                f"or remove it first (`{command('schedule remove ' + name)}`)"
            )
        schedule = schedule_app.add_schedule(
            name,
            cron,
            task,
            body,
            queue=queue,
            timezone=tz,
            priority=priority,
            max_attempts=max_attempts,
            enabled=not disabled,
            replace=replace,
        )
    report(schedule, as_json, "saved")


@app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """List the schedules with their next fire time, in their own time zone and UTC.

    With --json: a list of Schedule objects, each with "next_fire_at_local"
    (the next fire time in the schedule's time zone) added.

    Examples:

      pgqueue schedule list
    """
    with open_app() as schedule_app:
        schedules = schedule_app.list_schedules()
    if as_json:
        output.print_json([as_dict(s) for s in schedules])
        return
    rows = [
        (
            s.name,
            s.cron,
            s.timezone,
            s.task,
            s.queue,
            "yes" if s.enabled else "no",
            local_time(s),
            output.fmt_time(s.next_fire_at) if s.next_fire_at else "-",
            output.fmt_time(s.last_fire_at) if s.last_fire_at else "-",
            s.last_job_id,
        )
        for s in schedules
    ]
    columns = (
        *("name", "cron", "tz", "task", "queue", "enabled"),
        *("next (local)", "next (UTC)", "last fired", "last job"),
    )
    output.stdout().print(output.table(None, columns, rows))
    if not schedules:
        output.hint(f"no schedules: add one with `{command('schedule add')}`")


@app.command()
def enable(name: NameArgument, as_json: JsonOption = False) -> None:
    """Enable a schedule: it next fires at its first slot from now on.

    With --json: the Schedule.

    Examples:

      pgqueue schedule enable nightly-report
    """
    with open_app() as schedule_app:
        schedule = schedule_app.enable_schedule(name)
    report(schedule, as_json, "enabled")


@app.command()
def disable(name: NameArgument, as_json: JsonOption = False) -> None:
    """Disable a schedule: it does not fire, nor catch up later, until enabled.

    With --json: the Schedule.

    Examples:

      pgqueue schedule disable nightly-report
    """
    with open_app() as schedule_app:
        schedule = schedule_app.disable_schedule(name)
    report(schedule, as_json, "disabled")


@app.command()
def remove(name: NameArgument, as_json: JsonOption = False) -> None:
    """Delete a schedule (the jobs it enqueued stay).

    With --json: {"removed": NAME}.

    Examples:

      pgqueue schedule remove nightly-report
    """
    with open_app() as schedule_app:
        schedule_app.remove_schedule(name)
    if as_json:
        output.print_json({"removed": name})
    else:
        output.info(f"schedule {name!r} removed")


@app.command()
def run(name: NameArgument, as_json: JsonOption = False) -> None:
    """Enqueue one job of a schedule now (its fire times do not change).

    With --json: {"job_id", "created"}.

    Examples:

      pgqueue schedule run nightly-report
    """
    with open_app() as schedule_app:
        enqueued = schedule_app.run_schedule_now(name)
    if as_json:
        output.print_json(enqueued)
    else:
        output.info(f"schedule {name!r}: enqueued job {enqueued.job_id}")


def as_dict(schedule: pgqueue.Schedule) -> dict[str, Any]:
    data: dict[str, Any] = output.to_jsonable(schedule)
    nxt = schedule.next_fire_at
    data["next_fire_at_local"] = (
        nxt.astimezone(ZoneInfo(schedule.timezone)).isoformat() if nxt is not None else None
    )
    return data


def local_time(schedule: pgqueue.Schedule) -> str:
    if schedule.next_fire_at is None:
        return "-"
    return schedule.next_fire_at.astimezone(ZoneInfo(schedule.timezone)).strftime(
        "%Y-%m-%d %H:%M:%S %Z"
    )


def report(schedule: pgqueue.Schedule, as_json: bool, done: str) -> None:
    if as_json:
        output.print_json(as_dict(schedule))
        return
    when = (
        f"next fire {local_time(schedule)} ({output.fmt_time(schedule.next_fire_at)})"
        if schedule.enabled
        else "disabled"
    )
    output.info(f"schedule {schedule.name!r} {done}: {schedule.cron} {schedule.timezone}, {when}")
