"""The analysis stage runs in its own environment (workflow/envs/analysis.yaml: no torch, no lm-eval): every
module of analysis/ imports, and its command-line entry points start, with those packages blocked."""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import analysis

REPO = Path(__file__).resolve().parents[2]
BLOCK = ("import sys\n"
         "class Block:  # any import of a package the analysis env lacks (or of the evaluation stage) fails\n"
         "    def find_spec(self, name, path=None, target=None):\n"
         "        if name.split('.')[0] in ('torch', 'triton', 'lm_eval', 'transformers', 'datasets', 'tokenizers',\n"
         "                                  'safetensors', 'accelerate', 'eval'):\n"
         "            raise ImportError(f'{name} is not in the analysis environment')\n"
         "sys.meta_path.insert(0, Block())\n")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def analysis_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(analysis.__path__, "analysis.")
                  if not m.name.endswith(".__main__"))  # a __main__ runs its command on import


def test_every_analysis_module_imports_without_torch_lm_eval_or_eval():
    mods = analysis_modules()
    assert {"analysis.tables.build", "analysis.figures", "analysis.report", "analysis.stats"} <= set(mods)
    res = _run("".join(f"import {m}\n" for m in mods) + "print('ok')\n")
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_the_block_is_real():
    """The same harness refuses a module that does import torch (the check above can fail)."""
    res = _run("import mhar.model.transformer\n")
    assert res.returncode != 0 and "not in the analysis environment" in res.stderr
