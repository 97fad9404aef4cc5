"""Finding the user's App for ``pgqueue worker --app`` (and the commands that
need the tasks), with one-line errors that say what is wrong with the path."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import typer

import pgqueue
from pgqueue.connection import describe_target
from pgqueue_cli.errors import fail

APP_PATH_HELP = "pkg.module:app or path/to/tasks.py:app"


def load_app(path: str) -> pgqueue.App:
    """Import ``pkg.module:attribute`` (or ``path/to/file.py:attribute``) and
    return the App it names; every failure exits with a one-line error."""
    module_name, _, attribute = path.rpartition(":")
    if not module_name or not attribute:
        fail(f"--app must look like {APP_PATH_HELP}, got {path!r}")
    module_name = _module_name(module_name, path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            fail(
                f"--app {path!r}: no module named {exc.name!r} (looked in {os.getcwd()} and "
                f"sys.path; give a module path like {APP_PATH_HELP})"
            )
        _import_failed(module_name, exc)
    except Exception as exc:  # the user's own module failed: show where, framed
        _import_failed(module_name, exc)
    obj: Any = getattr(module, attribute, None)
    if isinstance(obj, pgqueue.App):
        return obj
    if isinstance(obj, pgqueue.Router):  # a worker serves every App of the router
        return obj  # type: ignore[return-value]
    found = sorted(name for name, value in vars(module).items() if isinstance(value, pgqueue.App))
    hint = (
        f" (it has {', '.join(f'{module_name}:{name}' for name in found)})"
        if found
        else " (it defines no pgqueue.App)"
    )
    if obj is None and not hasattr(module, attribute):
        fail(f"--app {path!r}: module {module_name!r} has no attribute {attribute!r}{hint}")
    fail(f"--app {path!r}: {attribute!r} is a {type(obj).__name__}, not a pgqueue.App{hint}")


def _module_name(text: str, path: str) -> str:
    """A dotted module name; a file path is imported from its directory."""
    if text.endswith(".py") or os.sep in text or "/" in text:
        file = Path(text if text.endswith(".py") else f"{text}.py").expanduser()
        if not file.is_file():
            fail(f"--app {path!r}: no such file {str(file)!r}")
        directory = str(file.resolve().parent)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        return file.stem
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return text


def _import_failed(module_name: str, exc: BaseException) -> None:
    """The user's traceback (their frames only), then one framed line."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename != __file__
        and "importlib" not in frame.filename
        and not frame.filename.startswith("<frozen")
    ]
    if frames:
        typer.echo("Traceback (most recent call last):", err=True)
        typer.echo("".join(traceback.format_list(frames)).rstrip("\n"), err=True)
    fail(f"error while importing {module_name}: {type(exc).__name__}: {exc}")


def check_target(app: pgqueue.App, ctx: typer.Context, dsn: str | None, schema: str) -> None:
    """Refuse ``--dsn``/``--schema`` given on the command line (or
    PGQUEUE_SCHEMA) that differ from the App's: the worker serves the App's
    database and schema, and silently ignoring the options would run the
    wrong queue. A PGQUEUE_DSN in the environment does not count against an
    App that names its own DSN."""
    if dsn and given_on_command_line(ctx, "dsn") and app.dsn != dsn:
        fail(
            f"--dsn ({describe_target(dsn)}) differs from the App's DSN "
            f"({describe_target(app.dsn)}): configure pgqueue.App(dsn=...) or drop --dsn"
        )
    explicit = _source(ctx, "schema") in ("COMMANDLINE", "ENVIRONMENT")
    if explicit and app.schema != schema:
        fail(
            f"--schema {schema!r} differs from the App's schema {app.schema!r}: "
            f"create it with pgqueue.App(schema={schema!r}) or drop --schema"
        )


def _source(ctx: typer.Context, option: str) -> str | None:
    """Where a global option's value came from (COMMANDLINE, ENVIRONMENT, DEFAULT)."""
    source = ctx.find_root().get_parameter_source(option)
    return None if source is None else str(source.name)


def given_on_command_line(ctx: typer.Context, option: str) -> bool:
    """Whether a global option was typed, as opposed to read from the environment."""
    return _source(ctx, option) == "COMMANDLINE"
