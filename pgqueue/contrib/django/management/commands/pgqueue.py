"""``manage.py pgqueue <command> ...``: the ``pgqueue`` CLI with Django's database."""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

# Django's own options that its launcher already acted upon.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


class Command(BaseCommand):
    help = (
        "Run a pgqueue command (migrate, worker, status, jobs, dashboard, ...) with "
        "Django's DATABASES settings, e.g. `manage.py pgqueue worker --concurrency 20`. "
        "`manage.py pgqueue --help` lists the commands."
    )
    # The CLI checks what it needs; Django's system checks would only slow a worker start.
    requires_system_checks: list[str] = []
    #: How this command was invoked, as Django's own usage line names it; the
    #: CLI's hints name it so (`manage.py pgqueue dlq requeue 9`).
    prog_name = "manage.py pgqueue"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="pgqueue command and options")

    def run_from_argv(self, argv: list[str]) -> None:
        program = os.path.basename(argv[0])  # as Django's ManagementUtility names it
        self.prog_name = f"{'python -m django' if program == '__main__.py' else program} {argv[1]}"
        # `manage.py pgqueue --help` is pgqueue's help, not Django's.
        if len(argv) > 2 and argv[2] in ("-h", "--help"):
            argv = [*argv[:2], "--", *argv[2:]]
        super().run_from_argv(argv)

    def handle(self, *args: str, **options: Any) -> None:
        from pgqueue_cli.main import app as cli

        from pgqueue.contrib.django import app_path, get_app

        given = [a for a in args if a != "--"]
        given = _drop_django_options(given)
        application = get_app()
        argv = ["--dsn", application.dsn, "--schema", application.schema, *given]
        if given[:1] == ["worker"] and not any(
            a == "--app" or a.startswith("--app=") for a in given
        ):
            argv += ["--app", app_path()]
        try:
            cli(args=argv, prog_name=self.prog_name)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise


def _drop_django_options(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in _DJANGO_OPTIONS:
            skip = True
            continue
        if arg.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
            continue
        out.append(arg)
    return out
