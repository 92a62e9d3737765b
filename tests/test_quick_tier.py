"""The quick tier (tests/quick_tier.py, marked by tests/conftest.py): every package folder contributes, every
name it lists exists, the marker is registered."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.quick_tier import QUICK

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_package_folder_contributes_to_the_quick_tier():
    folders = {p.parent.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")}
    listed = {Path(f).parent.as_posix() for f in QUICK}
    assert folders - listed == set(), f"tests/<folder>/ with no file in tests/quick_tier.py: {sorted(folders - listed)}"


def test_every_quick_entry_names_a_test_file_and_tests_that_exist():
    for rel, left_out in QUICK.items():
        path = TESTS / rel
        assert path.is_file(), rel
        text = path.read_text()
        for name in left_out:
            base = name.split("[")[0]
            assert re.search(rf"^def {re.escape(base)}\(", text, re.M), f"{rel}: no test {base}"


def test_the_quick_marker_is_registered():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("quick:") for m in markers)
    assert "quick" in (TESTS / "conftest.py").read_text()
