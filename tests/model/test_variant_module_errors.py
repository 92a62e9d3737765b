"""A variant module (``model.residual.module``) that fails to import - it raises while it runs, has a syntax
error, or imports a package that is not installed - is one `error:` line naming the module and the cause, in
the trainer and in the workflow's config check (before: a Python traceback). Nothing is written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODULES = {  # module source -> what the error line says about the cause
    "raises_on_import": ("import os\nraise RuntimeError('the GPU driver is too old for this variant')\n",
                         "RuntimeError: the GPU driver is too old for this variant", 2),
    "broken_syntax": ("def read(self, state:\n    return state\n", "SyntaxError: ", 1),
    "needs_a_package": ("import torch\nimport package_that_is_not_installed_xyz\n",
                        "it imports 'package_that_is_not_installed_xyz', which is not installed", 2),
}


@pytest.fixture()
def modules(tmp_path):
    folder = tmp_path / "mods"
    folder.mkdir()
    for name, (src, _, _) in MODULES.items():
        (folder / f"{name}.py").write_text(src)
    return folder


def _env(modules: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(modules)]), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def _one_line(res, module: str) -> str:
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out[-3000:]
    assert "Traceback" not in out and 'File "' not in out, out[-3000:]
    line = errors[0]
    src, says, lineno = MODULES[module]
    assert f".module: importing '{module}' failed" in line, line
    assert says in line and f"{module}.py, line {lineno}" in line, line
    return line


@pytest.mark.parametrize("module", sorted(MODULES))
def test_trainer_names_the_module_and_the_cause(tmp_path, modules, module):
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "mhar.train", str(ROOT / "config/train/cpu_tiny.yaml"),
                          "model.residual.variant=mine", f"model.residual.module={module}", "--out", str(out)],
                         cwd=tmp_path, env=_env(modules), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    _one_line(res, module)
    assert not out.exists()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_workflow_config_check_names_the_module_and_the_cause(tmp_path, modules, module):
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(work), "-n",
           "reproduce_table1", "--configfile", str(ROOT / "config" / "ci.yaml"),
           "--config", f"variants={{mine: {{variant: mine, module: {module}}}}}",
           "table1={variants: [mine], baseline: mine}", "downstream={variants: [mine], sizes: [debug], seeds: [0], "
           "tasks: [lambada_openai]}", "heads={variants: [mine], sizes: [debug], seeds: [0]}"]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(modules), capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    line = _one_line(res, module)
    assert "variants.mine.module" in line
    assert "Job stats" not in res.stdout + res.stderr and not (work / "results").exists()
