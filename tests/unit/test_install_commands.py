"""The install commands of the documentation install this checkout: a
requirement with extras but no path (``pip install 'src[dashboard]'``) is
read as a package name on PyPI, where ``pgqueue`` is another project."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# pip install [-e] 'SPEC' or "SPEC" or SPEC, SPEC with extras.
INSTALL = re.compile(r"pip install (?:-e )?['\"]?([^\s'\"]+\[[^\]]+\])")


def documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "examples").rglob("README.md")),
    ]


def test_every_documented_install_with_extras_names_a_path() -> None:
    found = []
    for path in documents():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for spec in INSTALL.findall(line):
                found.append(spec)
                where = f"{path.relative_to(ROOT)}:{number}"
                assert spec.startswith(("./", "../", "/", ".[")), (
                    f"{where}: pip install {spec!r} installs a package of that name from PyPI; "
                    "write '.[extra]' (this checkout) or './path[extra]'"
                )
    assert len(found) >= 10  # the README's extras and the examples' setups
