"""Narrow parts, checked on the source: the worker never changes its App
(its parts get what they use as constructor arguments, its live task
settings are its own), and no module reads another's private attributes.

Both checks are static approximations. An App is a name annotated ``App``,
a name ``app``, or ``self.app``; a private read is ``x._name`` where ``x`` is
not ``self`` or ``cls`` and ``_name`` is not a dunder."""

from __future__ import annotations

import ast
from pathlib import Path

import pgqueue

PACKAGE = Path(pgqueue.__file__).parent

#: Methods that change a list, dict or set in place.
MUTATORS = frozenset(
    {
        "add",
        "append",
        "clear",
        "discard",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "reverse",
        "setdefault",
        "sort",
        "update",
    }
)

#: Underscored names that are public API: ``os._exit``, and the namedtuple
#: methods (underscored so that they never clash with a field name).
PUBLIC_UNDERSCORED = frozenset({"_exit", "_asdict", "_fields", "_make", "_replace"})

#: file (relative to pgqueue/) -> attributes read there anyway, with the reason.
PRIVATE_READS_ALLOWED: dict[str, dict[str, str]] = {
    # isolated() re-points an App at a fresh schema and restores it after:
    # it swaps the App's own pools and statements, which nothing else may.
    "testing/isolation.py": {
        "_database": "the pool sizes of the App it re-points",
        "_queries": "the fresh App's statements, for the re-pointed context",
    },
    # WorkerApp.of: what a worker (or a drain) uses of its App, read once;
    # the worker's parts get the pools from it, never from the App.
    "worker/parts.py": {
        "_database": "the App's pool, handed to the worker's parts",
        "_listen_database": "where the worker's LISTEN connection opens",
    },
}


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _names_app(annotation: ast.expr | None) -> bool:
    """Whether an annotation says App (``App``, ``"App"``, ``App | None``...)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any(
        (isinstance(node, ast.Name) and node.id == "App")
        or (isinstance(node, ast.Attribute) and node.attr == "App")
        for node in ast.walk(annotation)
    )


def _app_names(tree: ast.Module) -> set[str]:
    names = {"app"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _names_app(node.annotation):
            names.add(node.arg)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _names_app(node.annotation)
        ):
            names.add(node.target.id)
    return names


def _is_app(node: ast.expr, app_names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in app_names
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "app"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _inside_app(node: ast.expr, app_names: set[str]) -> bool:
    """Whether ``node`` is an attribute or item of an App (at any depth)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
        if _is_app(node, app_names):
            return True
    return False


def app_mutations(source: str) -> list[str]:
    """Where ``source`` changes an App: assigns or deletes its attributes (or
    their items), calls an in-place method on one, or ``setattr`` on it."""
    tree = ast.parse(source)
    app_names = _app_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in MUTATORS
                and _inside_app(func.value, app_names)
            ) or (
                isinstance(func, ast.Name)
                and func.id in ("setattr", "delattr")
                and node.args
                and _is_app(node.args[0], app_names)
            ):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for target in targets:
            for element in ast.walk(target):
                if isinstance(element, ast.Attribute | ast.Subscript) and _inside_app(
                    element, app_names
                ):
                    found.append(f"{node.lineno}: {ast.unparse(element)}")
                    break
    return found


def private_reads(source: str) -> list[tuple[str, str]]:
    """``(attribute, where)`` for every ``x._name`` with ``x`` not self/cls."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not (node.attr.startswith("__") and node.attr.endswith("__"))
            and node.attr not in PUBLIC_UNDERSCORED
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append((node.attr, f"{node.lineno}: {ast.unparse(node)}"))
    return found


def test_nothing_in_the_worker_changes_its_app() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted((PACKAGE / "worker").rglob("*.py"))
        if (found := app_mutations(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_no_module_reads_another_objects_private_attributes() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        allowed = PRIVATE_READS_ALLOWED.get(name, {})
        found = [
            where
            for attr, where in private_reads(path.read_text(encoding="utf-8"))
            if attr not in allowed
        ]
        if found:
            offenders[name] = found
    assert offenders == {}


def test_the_allow_list_gives_reasons_and_is_still_needed() -> None:
    for name, allowed in PRIVATE_READS_ALLOWED.items():
        read = {attr for attr, _ in private_reads((PACKAGE / name).read_text(encoding="utf-8"))}
        for attr, reason in allowed.items():
            assert reason.strip(), f"{name}: {attr} needs a reason"
            assert attr in read, f"{name} no longer reads {attr}: drop it from the allow-list"


# --- the checks catch what they are for ------------------------------------------------


def test_app_mutations_catch_assignments_and_in_place_changes() -> None:
    source = """
def refresh(app: App, fresh: dict) -> None:
    app.live_task_settings.clear()
    app.live_task_settings.update(fresh)

class Part:
    def __init__(self, application: "App | None") -> None:
        application.tasks["x"] = None
        self.app = application

    def run(self) -> None:
        self.app.schema = "other"
        self.app.count += 1
        setattr(self.app, "dsn", "")
        del app.listen_dsn
"""
    lines = sorted(int(found.split(":")[0]) for found in app_mutations(source))
    assert lines == [3, 4, 8, 12, 13, 14, 15]


def test_app_mutations_let_reads_and_own_state_be() -> None:
    source = """
def start(app: App, settings: dict) -> None:
    tasks = sorted(app.tasks)
    settings.update(app.live_task_settings)
    mine: dict = {}
    mine.update(app.tasks)

class Part:
    def __init__(self, app: App) -> None:
        self.app = app
        self.tasks = app.tasks
        self.tasks_seen = len(self.app.tasks)
"""
    assert app_mutations(source) == []


def test_private_reads_catch_other_objects_only() -> None:
    source = """
class Part:
    _shared = 0

    def run(self, other) -> None:
        self._own = other._theirs
        cls._shared += 1
        os._exit(0)
        self.__dict__
        point._replace(x=1)
        self.owner._lock
"""
    assert sorted(private_reads(source)) == [
        ("_lock", "11: self.owner._lock"),
        ("_theirs", "6: other._theirs"),
    ]
