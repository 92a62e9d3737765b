"""Provenance beside a generated file, outside what git tracks.

Tracked outputs (tables, figures, probe JSONs, REPORT.md) hold only what their inputs determine: the command
and the input paths. What changes from one regeneration to the next without any input changing - the time,
the git commit and whether the tree is dirty, package versions, absolute paths - goes into
``<output>.provenance.json`` beside it, which .gitignore keeps out of git (``*.provenance.json``). So
regenerating a report from unchanged inputs leaves ``git status`` clean.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Optional, Sequence

from mhar.runs import provenance as run_provenance
from mhar.atomic import atomic_write_text

SUFFIX = ".provenance.json"
FOOTER = f"git commit, time and package versions in the `*{SUFFIX}` file beside it (not tracked)"
TRACKED_KEYS = ("command", "inputs")


def path_for(output: str | Path) -> Path:
    """The provenance file of ``output`` (a file or a PREFIX of PREFIX.csv/.md/.tex): OUTPUT.provenance.json."""
    p = Path(output)
    return p.with_name(p.name + SUFFIX)


def tracked(prov: dict) -> dict:
    """The part of a provenance record that may stand in a tracked file (determined by the inputs alone)."""
    return {k: prov[k] for k in TRACKED_KEYS if k in prov}


def write(output: str | Path, prov: dict) -> Path:
    """Write the whole provenance record of ``output`` beside it; returns its path."""
    path = path_for(output)
    atomic_write_text(path, json.dumps(prov, indent=1, sort_keys=True, default=str) + "\n")
    return path


def provenance(inputs: Sequence[str | os.PathLike], command: Optional[Sequence[str]] = None) -> dict:
    """Where a generated table/figure/probe came from: command, inputs, git commit, versions, time."""
    versions = {}
    for mod in ("numpy", "scipy", "statsmodels", "pandas", "matplotlib", "torch"):
        m = sys.modules.get(mod)
        if m is not None:
            versions[mod] = getattr(m, "__version__", "?")
    return {"command": " ".join(command if command is not None else sys.argv),
            "inputs": [str(p) for p in inputs], "git": run_provenance.git_info(), "python": platform.python_version(),
            "versions": versions, "generated_utc": run_provenance.utc_now()}
