"""Where a generated table or figure came from: command, inputs, git commit, versions, time."""
from __future__ import annotations

import os
import platform
import sys
from typing import Optional, Sequence

from mhar.runs import provenance as run_provenance


def provenance(inputs: Sequence[str | os.PathLike], command: Optional[Sequence[str]] = None) -> dict:
    """Where a generated table/figure came from: command, inputs, git commit, versions, time."""
    versions = {}
    for mod in ("numpy", "scipy", "statsmodels", "pandas", "matplotlib", "torch"):
        m = sys.modules.get(mod)
        if m is not None:
            versions[mod] = getattr(m, "__version__", "?")
    return {"command": " ".join(command if command is not None else sys.argv),
            "inputs": [str(p) for p in inputs], "git": run_provenance.git_info(), "python": platform.python_version(),
            "versions": versions, "generated_utc": run_provenance.utc_now()}

