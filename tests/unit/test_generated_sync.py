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
