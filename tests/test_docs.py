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


# --- the stage/package table of docs/ARCHITECTURE.md is the import graph's FORBIDDEN rule --------------------
_STAGE_HEADER = "| stage | package | environment | may import |"
_NAMES = {"torch": "torch", "lm-eval": "lm_eval"}  # how the table spells third-party packages


def stage_table(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """package -> (project packages it may import, names it must never import) from the stage table:
    backticked folders (``mhar/``'s torch-free modules count as ``mhar``); 'itself' = none of the others;
    after 'never': folders or third-party names."""
    lines = text.splitlines()
    start = lines.index(_STAGE_HEADER)
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        _stage, package, _env, may = (c.strip() for c in line.strip("|").split("|"))
        allowed_part, _, never_part = may.partition("never")
        allowed = {m for m in re.findall(r"`([\w]+)/`", allowed_part)}
        never = set(re.findall(r"`([\w]+)/`", never_part)) | {_NAMES.get(w, w) for w in
                                                              re.findall(r"\b(torch|lm-eval)\b", never_part)}
        for pkg in re.findall(r"`([\w]+)/`", package):
            rows[pkg] = (allowed, never)
    return rows


def table_mismatches(rows: dict, forbidden: dict, stages: set[str]) -> list[str]:
    """Where the table and ``forbidden`` (package -> forbidden top-level names) disagree."""
    bad = []
    for pkg, banned in forbidden.items():
        if pkg not in rows:
            bad.append(f"{pkg}/: no row in the stage table")
            continue
        allowed, never = rows[pkg]
        want = stages - {pkg} - set(banned)  # the project packages the rule lets it import
        if allowed != want:
            bad.append(f"{pkg}/: the table lets it import {sorted(allowed)}, the rule {sorted(want)}")
        if not never <= set(banned):
            bad.append(f"{pkg}/: the table forbids {sorted(never - set(banned))}, the rule does not")
    return bad


def test_stage_table_matches_the_import_rule():
    from tests.test_import_graph import FORBIDDEN, WORKFLOW

    rows = stage_table((REPO / "docs" / "ARCHITECTURE.md").read_text())
    stages = set(FORBIDDEN) | {"workflow"}
    assert all(WORKFLOW <= set(banned) for banned in FORBIDDEN.values())  # no stage imports workflow code
    assert table_mismatches(rows, FORBIDDEN, stages) == []
    assert rows["workflow"][0] == set(FORBIDDEN)  # the workflow may import every stage


def test_stage_table_check_sees_a_difference():
    text = (f"{_STAGE_HEADER}\n|---|---|---|---|\n| a | `mhar/` | x | itself |\n"
            "| b | `eval/` | x | `mhar/`, `analysis/` |\n| c | `analysis/` | x | `mhar/`; never `eval/`, torch |\n")
    rows = stage_table(text)
    assert rows == {"mhar": (set(), set()), "eval": ({"mhar", "analysis"}, set()),
                    "analysis": ({"mhar"}, {"eval", "torch"})}
    forbidden = {"mhar": {"eval", "analysis", "workflow"}, "eval": {"analysis", "workflow"},
                 "analysis": {"eval", "lm_eval", "workflow"}}
    assert table_mismatches(rows, forbidden, {"mhar", "eval", "analysis", "workflow"}) == [
        "eval/: the table lets it import ['analysis', 'mhar'], the rule ['mhar']",
        "analysis/: the table forbids ['torch'], the rule does not"]
