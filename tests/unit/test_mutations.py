"""tools/mutations.py injects known bugs by exact text replacement; this keeps
its list from rotting: every original text is still found exactly once, and
applying a mutation and leaving (even by an exception) restores the files."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutations() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutations", ROOT / "tools/mutations.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutations", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutation_still_applies_exactly_once() -> None:
    assert _mutations().problems() == []


def test_applying_a_mutation_restores_the_files_even_on_an_error(tmp_path: Path) -> None:
    mutations = _mutations()
    mutation = mutations.BY_NAME["lease-head-serial"]
    for edit in mutation.edits:
        (tmp_path / edit.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / edit.path, tmp_path / edit.path)
    before = {e.path: (tmp_path / e.path).read_text() for e in mutation.edits}

    def interrupted_while_applied() -> None:
        with mutations.applied(mutation, root=tmp_path):
            for edit in mutation.edits:
                text = (tmp_path / edit.path).read_text()
                assert edit.old not in text
                assert edit.new in text
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_while_applied()

    assert {e.path: (tmp_path / e.path).read_text() for e in mutation.edits} == before
