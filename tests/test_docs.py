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
    for path in set(re.findall(r"python3? ((?:benchmarks|workflow|eval|analysis|mhar)/[\w/]+\.py)", text)):
        if not (REPO / path).is_file():
            bad.append(path)
    for path in set(re.findall(r"\b((?:config|profiles)/[\w/.-]+\.yaml|profiles/\w+)\b", text)):
        if not (REPO / path).exists():
            bad.append(path)
    assert not bad, f"{doc.relative_to(REPO)} names what does not exist: {sorted(bad)}"


PATH_ROOTS = ("mhar/", "eval/", "analysis/", "workflow/", "config/", "tests/", "benchmarks/", "scripts/", "docs/", "profiles/",
              "results/bench/")


def named_paths(text: str) -> set[str]:
    """Repository paths a document names: `code` spans or table cells that start with a top-level folder of the
    repository (patterns with <placeholders>, {alternatives}, * or ... are not single paths)."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text) + re.findall(r"\|\s*([\w./-]+/[\w./-]*)\s*\|", text):
        for token in re.split(r"[\s,()]+", span):
            token = token.strip("[]").rstrip(".:;")
            if token.startswith(PATH_ROOTS) and not re.search(r"[<{*$]|\.\.\.", token):
                found.add(token.split("::")[0])
    return found


@pytest.mark.parametrize("doc", ["docs/ARCHITECTURE.md", "docs/DESIGN.md"])
def test_architecture_names_only_paths_that_exist(doc):
    text = (REPO / doc).read_text()
    missing = sorted(p for p in named_paths(text) if not (REPO / p).exists())
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_architecture_is_a_short_map():
    assert len((REPO / "docs" / "ARCHITECTURE.md").read_text().splitlines()) <= 200


def test_path_check_sees_a_missing_path():
    assert named_paths("| `mhar/nope.py` | x |\n`analysis/load/<x>.py` `mhar/model/` ") == {"mhar/nope.py", "mhar/model/"}
