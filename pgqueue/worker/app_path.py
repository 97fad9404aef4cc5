"""The App's import path (``pkg.module:attribute``) for ``--pool process``:
found in the worker (``find_app_path``), imported in each child
(``load_app``), where the worker's App cannot be handed over."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from pgqueue.errors import InvalidOption

#: Set in a child's environment: ``run_worker`` refuses to start there.
CHILD_ENV = "PGQUEUE_POOL_CHILD"


def _kind_of(obj: Any, module: str) -> bool:
    # By the defining module of its class (or a base's): the worker imports
    # nothing of pgqueue.app or pgqueue.router (see ARCHITECTURE.md), and no
    # attribute is read of arbitrary module globals (some load things on access).
    return any(getattr(c, "__module__", None) == module for c in type(obj).__mro__)


def _is_app(obj: Any) -> bool:
    return _kind_of(obj, "pgqueue.app")


def _is_router(obj: Any) -> bool:
    return _kind_of(obj, "pgqueue.router")


def find_app_path(app: Any) -> str:
    """Where a child can import ``app`` from: a module attribute that is
    ``app`` (or a Router holding it). The modules of the App's tasks are
    looked at first, then every imported module. A script run as
    ``__main__`` is named by its file (children import it under its own
    name, so its ``if __name__ == "__main__":`` block does not run there).
    Raises :class:`InvalidOption` when no module holds the App."""
    tasks = getattr(app, "tasks", {})
    first = [getattr(getattr(t, "func", None), "__module__", None) for t in tasks.values()]
    names = [n for n in dict.fromkeys(first) if n] + [n for n in list(sys.modules) if n]
    for name in dict.fromkeys(names):
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            attrs = list(vars(module).items())
        except TypeError:
            continue
        for attr, value in attrs:
            if value is app or (_is_router(value) and any(a is app for a in value.apps.values())):
                return _module_path(name, module, attr)
    raise InvalidOption(
        "pool='process' needs to import the App in each child, and no module holds it "
        "as an attribute: define the App at module level, or pass app_path='pkg.module:app'"
    )


def _module_path(name: str, module: Any, attr: str) -> str:
    if name != "__main__":
        return f"{name}:{attr}"
    file = getattr(module, "__file__", None)
    if not file:
        raise InvalidOption(
            "pool='process' cannot import an App defined in an interactive session or "
            "`python -c`: define it in a module and pass app_path='pkg.module:app'"
        )
    return f"{Path(file).resolve()}:{attr}"


def load_app(path: str, dsn: str, schema: str) -> Any:
    """Import the App at ``path`` (``pkg.module:attr`` or ``file.py:attr``) and
    point it at ``dsn``/``schema`` when it was created elsewhere (a worker
    whose App was re-pointed). A Router's App is the one on that database and
    schema. Raises :class:`InvalidOption` saying what is wrong."""
    module_text, _, attribute = path.rpartition(":")
    if not module_text or not attribute:
        raise InvalidOption(f"app path must look like pkg.module:app, got {path!r}")
    if module_text.endswith(".py") or os.sep in module_text or "/" in module_text:
        file = Path(module_text if module_text.endswith(".py") else f"{module_text}.py")
        if not file.is_file():
            raise InvalidOption(f"app path {path!r}: no such file {str(file)!r}")
        directory = str(file.resolve().parent)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        module_text = file.stem
    try:
        module = importlib.import_module(module_text)
    except Exception as exc:
        raise InvalidOption(
            f"app path {path!r}: importing {module_text!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = getattr(module, attribute, None)
    if _is_router(obj):
        matching = [a for a in obj.apps.values() if a.schema == schema and a.dsn == dsn] or [
            a for a in obj.apps.values() if a.schema == schema
        ]
        if len(matching) != 1:
            raise InvalidOption(
                f"app path {path!r}: the Router has no single App on schema {schema!r}"
            )
        obj = matching[0]
    if not _is_app(obj):
        raise InvalidOption(
            f"app path {path!r}: {attribute!r} is {type(obj).__name__}, not a pgqueue.App"
        )
    if obj.dsn != dsn or obj.schema != schema:
        obj.point_at(dsn, schema=schema)
    return obj
