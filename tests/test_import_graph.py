"""Data flows one way: the library (mhar/) never imports the evaluation (eval/) or analysis (analysis/) stages
or workflow code; eval/ never imports analysis/ or workflow code; analysis/ never imports eval/, workflow code,
torch or lm-eval (its environment, workflow/envs/analysis.yaml, has neither). Checked statically over every .py
file (AST: plain, relative, function-local and importlib imports), and at run time for the trainer. Also: no
import cycle (function-level imports included), every lazy import says why, the lower floors of mhar/ import
nothing above them, and a computation with one home (compile, loss, scoring) is called from there only."""
from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# top-level names of workflow code: the Snakemake workflow (rules, scripts and their _glue helper),
# Snakemake itself, benchmark scripts and tests
WORKFLOW = {"workflow", "_glue", "snakemake", "benchmarks", "tests", "Snakefile"}
# what the analysis environment lacks: the evaluation stage and its heavy dependencies
NO_TORCH = {"torch", "triton", "lm_eval", "transformers", "datasets", "tokenizers", "safetensors", "accelerate"}
FORBIDDEN = {"mhar": {"eval", "analysis"} | WORKFLOW, "eval": {"analysis"} | WORKFLOW,
             "analysis": {"eval"} | NO_TORCH | WORKFLOW}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = module_name(path, root).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out += [(node.lineno, f"{mod}.{a.name}" if mod else a.name) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(root: Path) -> list[str]:
    """Every import that runs against the data flow, as 'file:line: package imports module'."""
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, mod in imported_modules(path, root):
                if mod.split(".")[0] in forbidden:
                    bad.append(f"{path.relative_to(root)}:{line}: {package}/ imports {mod}")
    return bad


def test_library_and_eval_import_only_downward():
    assert violations(ROOT) == []


@pytest.mark.parametrize("package,line,expect", [
    ("mhar", "from analysis.tables import make_table", "mhar/ imports analysis.tables.make_table"),
    ("mhar", "import eval.run", "mhar/ imports eval.run"),
    ("mhar", "from ...eval import adapter", "mhar/ imports eval.adapter"),  # relative, from mhar/sub/mod.py
    ("mhar", "def f():\n    from _glue import start", "mhar/ imports _glue.start"),
    ("mhar", "import importlib\nm = importlib.import_module('eval.run')", "mhar/ imports eval.run"),
    ("eval", "from workflow.scripts import _glue", "eval/ imports workflow.scripts._glue"),
    ("eval", "import snakemake", "eval/ imports snakemake"),
    ("eval", "from analysis.tables.build import make_table", "eval/ imports analysis.tables.build.make_table"),
    ("analysis", "import torch", "analysis/ imports torch"),
    ("analysis", "def f():\n    from eval.probe import run_probe", "analysis/ imports eval.probe.run_probe"),
    ("analysis", "from lm_eval.api.metrics import mean", "analysis/ imports lm_eval.api.metrics.mean"),
])
def test_checker_finds_upward_imports(tmp_path, package, line, expect):
    (tmp_path / "mhar" / "sub").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    (tmp_path / "analysis").mkdir()
    for d in ("mhar", "mhar/sub", "eval", "analysis"):
        (tmp_path / d / "__init__.py").write_text("")
    ok = "from mhar.model.transformer import Transformer\nfrom ..config import ConfigError\n"
    (tmp_path / "mhar" / "sub" / "ok.py").write_text(ok)
    (tmp_path / "eval" / "ok.py").write_text("from mhar.runs.checkpoint import load_model\nfrom .records import x\n")
    (tmp_path / "analysis" / "ok.py").write_text("from mhar.runs.pairing import differences\nfrom .stats import paired\n")
    assert violations(tmp_path) == []
    target = tmp_path / package / ("sub/mod.py" if package == "mhar" else "mod.py")
    target.write_text(line + "\n")
    (found,) = violations(tmp_path)
    assert found.endswith(expect), found


def test_trainer_loads_no_cpt_eval_or_workflow_module():
    code = ("import sys, mhar.train; "
            "print('\\n'.join(m for m in sys.modules if m.split('.')[0] in ('eval', 'workflow', '_glue', "
            "'snakemake', 'lm_eval') or m.startswith('mhar.cpt')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == []


def test_workflow_scripts_import_names_that_exist():
    """Every `from X import name` of the workflow's scripts and rule files resolves (catches a moved function)."""
    wanted = {}
    files = sorted((ROOT / "workflow").rglob("*.py")) + sorted((ROOT / "workflow").rglob("*.smk"))
    for path in files:
        for line in path.read_text().splitlines():
            node = ast.parse(line.strip()).body[0] if line.startswith("from ") and "(" not in line else None
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("mhar", "eval", "analysis", "_glue"):
                wanted.setdefault(node.module, set()).update(a.name for a in node.names)
    assert {"eval.cpt", "analysis.tables.build", "mhar.cpt", "_glue"} <= set(wanted)
    code = ("import importlib, importlib.util\nmissing = []\n"
            "def has(m, mod, n):\n"
            "    return hasattr(m, n) or importlib.util.find_spec(mod + '.' + n) is not None\n" + "".join(
                f"m = importlib.import_module({mod!r})\n"
                f"missing += [{mod!r} + '.' + n for n in {sorted(names)!r} if not has(m, {mod!r}, n)]\n"
                for mod, names in sorted(wanted.items())) + "print(' '.join(missing))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'workflow' / 'scripts'}"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == []


# --- import cycles -----------------------------------------------------------------------------------------
# Every import between the project's modules counts, function-level ones included: a lazy import may avoid a
# heavy optional third-party dependency (transformers, lm_eval, triton, ...), never a project module's cycle.
CYCLE_PACKAGES = ("mhar", "eval", "analysis")


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines of ``if TYPE_CHECKING:`` blocks (annotations only: never executed)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def import_graph(root: Path, packages=CYCLE_PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line}; an imported name resolves to the longest module prefix
    (``from mhar.model.residuals import register`` -> mhar.model.residuals). No edge to parent packages."""
    paths = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in paths.items():
        skip = _type_checking_lines(ast.parse(path.read_text(), filename=str(path)))
        edges = graph.setdefault(mod, {})
        for line, name in imported_modules(path, root):
            parts = name.split(".")
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in paths),
                          None)
            if target is not None and target != mod and line not in skip:
                edges.setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (modules, first repeated at the end) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:  # the shortest way back to the component's first module
        start = min(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while True:
            path.append(prev[path[-1]])
            if path[-1] == start:
                break
        cycles.append(path[::-1])
    return sorted(cycles)


def cycle_text(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_checker_finds_function_level_cycles(tmp_path):
    (tmp_path / "mhar" / "sub").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    files = {
        "mhar/__init__.py": "", "mhar/sub/__init__.py": "", "eval/__init__.py": "",
        "mhar/a.py": "from mhar.sub import b\nimport json\n",
        "mhar/sub/b.py": "def f():\n    from mhar.a import g\n",  # function-level: counts
        "mhar/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mhar.d import X\n",
        # annotations-only and third-party imports: no cycle
        "mhar/d.py": "from mhar.c import Y\ndef f():\n    import triton\n",
        "eval/e.py": "from mhar.a import g\nfrom . import f\n", "eval/f.py": "def h():\n    from eval.e import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path)
    cycles = import_cycles(graph)
    assert cycles == [["eval.e", "eval.f", "eval.e"], ["mhar.a", "mhar.sub.b", "mhar.a"]]
    assert cycle_text(graph, cycles[1]) == "mhar.a (line 1) -> mhar.sub.b (line 2) -> mhar.a"


def _cycles_text(cycles: list[list[str]], graph) -> str:
    return "import cycles:\n" + "\n".join(cycle_text(graph, c) for c in cycles)


def test_model_package_has_no_import_cycles():
    graph = import_graph(ROOT)
    cycles = [c for c in import_cycles(graph) if any(m.startswith("mhar.model") for m in c)]
    assert cycles == [], _cycles_text(cycles, graph)


def test_no_import_cycles():
    graph = import_graph(ROOT)
    cycles = import_cycles(graph)
    assert cycles == [], _cycles_text(cycles, graph)


# --- lazy imports ------------------------------------------------------------------------------------------
# A function-level import (of a project module, a third-party package or the standard library) stays only where
# importing it at module top would load a heavy or optional dependency the importing module otherwise avoids
# (torch, triton, transformers, lm_eval, pandas, ...); the reason is written beside it: a comment on the
# statement's line or the line directly above. Checked in the library, both stages, the benchmarks and scripts/.
LAZY_PACKAGES = CYCLE_PACKAGES + ("benchmarks", "scripts")


def _comment_lines(text: str) -> set[int]:
    """Lines holding a comment (tokens, so a '#' inside a string does not count)."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT}


def uncommented_lazy_imports(root: Path, packages=LAZY_PACKAGES) -> list[str]:
    """'file:line: statement' of every import inside a function of ``packages`` (any module: project,
    third-party or standard library) with no comment on its line(s) or on the line directly above."""
    bad = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            comments, lines = _comment_lines(text), text.splitlines()
            for fn in ast.walk(ast.parse(text, filename=str(path))):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, (ast.Import, ast.ImportFrom)):
                        continue
                    if not comments & set(range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)):
                        bad.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(set(bad))  # a nested function's imports are walked once per enclosing function


def test_checker_finds_uncommented_lazy_imports(tmp_path):
    for d in ("mhar", "eval", "benchmarks", "scripts"):
        (tmp_path / d).mkdir()
    (tmp_path / "mhar" / "a.py").write_text(
        "from mhar.b import top  # module level: no reason needed\n"
        "import os\n"
        "def f():\n"
        "    import json\n"  # the standard library counts too
        "    import evaluate\n"  # a third-party package
        "    # torch: only when a model is built\n"
        "    from mhar.model import build\n"
        "    from mhar.runs import save  # torch\n"
        "    s = '# not a comment'\n"
        "    from mhar.c import x\n"
        "    def g():\n"
        "        from .d import y\n")
    (tmp_path / "eval" / "e.py").write_text(
        "def h():\n    from mhar.runs.checkpoint import (\n        load_model,  # lazy: torch\n    )\n"
        "def k():\n    import eval.f\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def m():\n    import triton.testing\n")
    (tmp_path / "scripts" / "s.py").write_text("def n():\n    import yaml  # lazy: a reason\n")
    assert uncommented_lazy_imports(tmp_path) == [
        "benchmarks/b.py:2: import triton.testing", "eval/e.py:6: import eval.f", "mhar/a.py:10: from mhar.c import x",
        "mhar/a.py:12: from .d import y", "mhar/a.py:4: import json", "mhar/a.py:5: import evaluate"]


def test_every_lazy_import_says_why():
    bad = uncommented_lazy_imports(ROOT)
    assert bad == [], ("function-level imports without a reason (move each to the module's top-level imports, "
                       "or write why it stays lazy beside it):\n" + "\n".join(bad))


# --- lower floors stay low -------------------------------------------------------------------------------
# Inside mhar/: the generic I/O module (mhar/atomic.py) imports nothing of the project and no torch; data/ sits
# below runs/; the model module imports nothing of inference (decoding and scoring import the model, and an
# export ships the model without the runner); hf/ (the Llama / Qwen mapping included) sits below cpt/.
FLOORS = [  # (files, forbidden module prefixes, why)
    ("mhar/atomic.py", ("mhar", "eval", "analysis", "torch"), "generic I/O: the lowest floor, torch-free"),
    ("mhar/safe_yaml.py", ("mhar", "eval", "analysis", "torch"), "the YAML reader: the lowest floor, torch-free"),
    ("mhar/data", ("mhar.runs", "mhar.training", "mhar.hf", "mhar.cpt"), "data/ sits below runs/"),
    ("mhar/model/transformer.py", ("mhar.model.inference",), "inference imports the model, not the reverse"),
    ("mhar/hf", ("mhar.cpt",), "hf/ holds the Llama / Qwen mapping; cpt/ sits above it"),
]


def floor_violations(root: Path) -> list[str]:
    bad = []
    for where, forbidden, why in FLOORS:
        base = root / where
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [base] if base.is_file() else []:
            for line, mod in imported_modules(path, root):
                if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                    bad.append(f"{path.relative_to(root)}:{line}: imports {mod} ({why})")
    return bad


def test_lower_floors_import_nothing_above_them():
    assert floor_violations(ROOT) == []


def test_floor_checker_sees_a_climb(tmp_path):
    (tmp_path / "mhar" / "data").mkdir(parents=True)
    (tmp_path / "mhar" / "data" / "shards.py").write_text("from mhar.atomic import read_json\n"
                                                          "def f():\n    from mhar.runs.config import DataConfig\n")
    (tmp_path / "mhar" / "atomic.py").write_text("import json\nimport torch\n")
    assert floor_violations(tmp_path) == [
        "mhar/atomic.py:2: imports torch (generic I/O: the lowest floor, torch-free)",
        "mhar/data/shards.py:3: imports mhar.runs.config.DataConfig (data/ sits below runs/)"]


def test_eval_run_cleans_temp_files_without_torch(tmp_path):
    """eval.run's record writes (a killed write's temp file removed first) load no torch."""
    stale = tmp_path / ".results.json.999999999.tmp"  # no such pid
    stale.write_text("half")
    code = ("import sys, pathlib, eval.run; "
            f"eval.run._atomic_write(pathlib.Path({str(tmp_path / 'results.json')!r}), 'x'); "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def _calls(root: Path, packages, name: str) -> list[str]:
    """'file:line' of every call of an attribute or function called ``name`` in ``packages``."""
    out = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call):
                    f = node.func
                    if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == name:
                        out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


@pytest.mark.parametrize("name,home", [
    ("compile", ["mhar/model/compile.py"]),  # torch.compile: only through compile_fn
    ("cross_entropy", ["mhar/model/transformer.py"]),  # the loss: lm_loss
    ("log_softmax", ["mhar/model/inference/scoring.py"]),  # scoring: logit_logprobs
])
def test_one_home_per_computation(name, home):
    calls = _calls(ROOT, ("mhar", "eval", "analysis", "benchmarks", "scripts"), name)
    if name == "compile":  # re.compile and friends are not torch.compile
        calls = [c for c in calls if "torch.compile(" in (ROOT / c.split(":")[0]).read_text().splitlines()[
            int(c.split(":")[1]) - 1]]
    assert [c.split(":")[0] for c in calls] == home and len(calls) == 1, calls


# --- module size ---------------------------------------------------------------------------------------------
LONG_OK = {"mhar/model/routing/_kernels.py"}  # the Triton kernels: one file of @triton.jit functions


def test_no_module_over_600_lines_but_the_triton_kernels():
    """A module that grows past 600 lines holds more than one concept: split it (issue 55)."""
    long = sorted(f"{p.relative_to(ROOT)} ({n})" for pkg in ("mhar", "eval", "analysis", "benchmarks", "scripts",
                                                              "workflow")
                  for p in (ROOT / pkg).rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 600 and str(p.relative_to(ROOT)) not in LONG_OK)
    assert long == []
