"""The sync App and driver are generated from their async source
(tools/async_to_sync.py): the committed files must be what it writes now."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff (the [dev] extra) formats the generated code")
    return _generator()


def test_every_generated_sync_module_is_fresh(generator) -> None:  # type: ignore[no-untyped-def]
    stale = [
        target.name
        for source, target in generator.MODULES.items()
        if target.read_text() != generator.generate(source, target)
    ]
    assert stale == [], f"run `{sys.executable} tools/async_to_sync.py`"


def test_the_rules_turn_async_code_into_its_sync_twin() -> None:
    convert = _generator().convert
    source = (
        "import asyncio\n"
        "async def run_async(self, conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[int]:\n"
        "    async with await self.pool_async() as pool:  # the pool\n"
        "        async for x in pool.rows():\n"
        "            await asyncio.sleep(0)\n"
        "    c = await async_connection(conn)\n"
    )
    assert convert(source) == (
        "import time\n"
        "def run(self, conn: psycopg.Connection[Any]) -> Iterator[int]:\n"
        "    with self.pool() as pool:  # the pool\n"
        "        for x in pool.rows():\n"
        "            time.sleep(0)\n"
        "    c = sync_connection(conn)\n"
    )


def test_a_stale_module_fails_the_check(generator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, target = next(iter(generator.MODULES.items()))
    copy = tmp_path / target.name
    copy.write_text(target.read_text() + "\n# edited by hand\n")
    generator.MODULES = {source: copy}
    try:
        assert generator.main(["--check"]) == 1
        assert generator.main([]) == 0
        assert copy.read_text() == target.read_text()
    finally:
        generator.MODULES = _generator().MODULES


# Hand-written sync/async pairs outside the generated modules, each a thin
# door onto one shared body (or a protocol users implement both ways). Any
# other pair is a twin that can drift: generate it from its async source or
# give both one body.
ONE_BODY_PAIRS = {
    # the sync one runs the async one on a loop of its own
    "pgqueue/testing/drain.py:drain",
    "pgqueue/testing/perform.py:perform",
    "pgqueue/worker/runner.py:run_worker",
    "pgqueue/worker/runner.py:run_workers",
    "pgqueue/app.py:App.run_worker",
    "pgqueue/router.py:Router.run_worker",
    # each forwards to the App's own generated pair
    "pgqueue/router.py:Router.enqueue",
    "pgqueue/router.py:Router.get_job",
    "pgqueue/router.py:RoutedTask.enqueue",
    "pgqueue/router.py:RoutedCall.enqueue",
    "pgqueue/task.py:Task.enqueue",
    "pgqueue/task.py:TaskCall.enqueue",
    "pgqueue/workflow.py:Workflow.enqueue",
    # the pools: psycopg's two pool classes (written once, beside each other)
    "pgqueue/database.py:Database.pool",
    "pgqueue/database.py:Database.close",
    "pgqueue/app.py:App.close",
    # middleware: users implement either hook; the base class forwards
    "pgqueue/middleware.py:Middleware.process",
    "pgqueue/contrib/sentry.py:SentryMiddleware.process",
}


def _pairs(root: Path) -> set[str]:
    import ast

    generated = {target.resolve() for target in _generator().MODULES.values()}
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if path.resolve() in generated:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes: list[tuple[str, list[ast.stmt]]] = [("", tree.body)]
        scopes += [(f"{n.name}.", n.body) for n in tree.body if isinstance(n, ast.ClassDef)]
        for prefix, body in scopes:
            sync = {n.name for n in body if isinstance(n, ast.FunctionDef)}
            for node in body:
                if not isinstance(node, ast.AsyncFunctionDef):
                    continue
                name = node.name.removesuffix("_async")
                if name != node.name and name in sync:
                    rel = path.relative_to(root.parent).as_posix()
                    found.add(f"{rel}:{prefix}{name}")
    return found


def test_no_hand_written_twins_beyond_the_known_doors() -> None:
    assert _pairs(ROOT / "pgqueue") == ONE_BODY_PAIRS


def test_the_twin_scan_finds_a_planted_pair(tmp_path: Path) -> None:
    package = tmp_path / "pgqueue"
    package.mkdir()
    (package / "planted.py").write_text(
        "class A:\n    def go(self): ...\n    async def go_async(self): ...\n"
        "def f(): ...\nasync def f_async(): ...\n"
    )
    assert _pairs(package) == {"pgqueue/planted.py:A.go", "pgqueue/planted.py:f"}
