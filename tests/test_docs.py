"""The README and the performance docs stay short and true: the README fits 120 lines of normal length, every
relative link resolves, and every command they name exists (``python -m MODULE`` is a module of this
repository or an installed one; ``python path.py`` and ``config/...`` files are in the repository)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "results" / "bench" / "README.md"]


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines (at most 120; details go to docs/)"
    long = [i for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README.md lines longer than 120 characters: {long}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_and_commands_exist(doc):
    text = doc.read_text()
    bad = []
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if not re.match(r"[a-z]+:", target) and not (doc.parent / target).exists():
            bad.append(f"link {target}")
    for mod in set(re.findall(r"python3? -m ([A-Za-z_][\w.]*)", text)):
        if mod not in ("pip", "pytest", "venv") and importlib.util.find_spec(mod) is None:
            bad.append(f"python -m {mod}")
    for path in set(re.findall(r"python3? ((?:benchmarks|workflow|eval|mhar)/[\w/]+\.py)", text)):
        if not (REPO / path).is_file():
            bad.append(path)
    for path in set(re.findall(r"\b((?:config|profiles)/[\w/.-]+\.yaml|profiles/\w+)\b", text)):
        if not (REPO / path).exists():
            bad.append(path)
    assert not bad, f"{doc.relative_to(REPO)} names what does not exist: {sorted(bad)}"
