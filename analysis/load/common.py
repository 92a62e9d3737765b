"""What every loader of the analysis stage shares: the error type, safe JSON / YAML / JSONL reading, the
finite-number check, and the CLI wrapper of the ``python -m eval.*`` commands.

Formats are the contract in docs/ARCHITECTURE.md ("Run directory", "Evaluation outputs"). Every loader fails
with a message that names the file and the field and says what to do.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import yaml

from mhar.atomic import read_json as atomic_read_json
from mhar.safe_yaml import YAMLRefused, read_yaml_file, yaml_error_line


class AnalysisInputError(ValueError):
    """An input file of the analysis stage is missing or malformed (message names file and field)."""



def read_json(path: Path) -> Any:
    """The JSON document at ``path``; a missing or malformed file is one AnalysisInputError line."""
    return atomic_read_json(path, error=AnalysisInputError)


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML (or JSON) file, safely: a tag that would build a Python object (``!!python/...``) is refused,
    never executed; malformed YAML is one AnalysisInputError line naming the file and the place."""
    path = Path(path)
    try:
        return read_yaml_file(path)  # bounded: a document over the size limit or an alias bomb is refused
    except FileNotFoundError:
        raise AnalysisInputError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise AnalysisInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except YAMLRefused as e:
        raise AnalysisInputError(f"{path}: {yaml_error_line(e)}") from None
    except yaml.YAMLError as e:
        raise AnalysisInputError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None


def read_mapping(path: Path) -> dict:
    """A YAML mapping ({} when the file is absent); malformed YAML is an AnalysisInputError."""
    if not path.is_file():
        return {}
    d = read_yaml(path) or {}
    return d if isinstance(d, dict) else {}



def is_finite_number(v: Any) -> bool:
    """A real, finite number (not a string such as "NaN", not None, not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)



def jsonl_rows(path: Path) -> Iterable[tuple[int, Any]]:
    """(line number, parsed row) of each non-blank line of a JSONL file."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            raise AnalysisInputError(f"{path}:{i}: not valid JSON ({e})") from None



def run_cli(prog: str, produce, argv: Optional[Sequence[str]]) -> int:
    """Run ``produce(command)`` for a ``python -m <prog>`` CLI: print the written paths, or one
    ``error:`` line and exit code 2 on bad input (AnalysisInputError)."""
    cmd = f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        paths = produce(cmd)
    except AnalysisInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output location that cannot be written (a file in the way, no permission, ...)
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        print(f"error: cannot write{where}: {e.strerror or e}; choose another --out", file=sys.stderr)
        return 2
    print("\n".join(map(str, paths)))
    return 0
