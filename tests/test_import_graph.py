"""Data flows one way: the library (mhar/) never imports analysis (eval/) or workflow code, and
eval/ never imports workflow code. Checked statically over every .py file (AST: plain, relative,
function-local and importlib imports), and at run time for the trainer."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# top-level names of workflow code: the Snakemake workflow (rules, scripts and their _glue helper),
# Snakemake itself, benchmark scripts and tests
WORKFLOW = {"workflow", "_glue", "snakemake", "benchmarks", "tests", "Snakefile"}
FORBIDDEN = {"mhar": {"eval"} | WORKFLOW, "eval": WORKFLOW}


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
    ("mhar", "from eval.tables import make_table", "mhar/ imports eval.tables.make_table"),
    ("mhar", "import eval.run", "mhar/ imports eval.run"),
    ("mhar", "from ...eval import adapter", "mhar/ imports eval.adapter"),  # relative, from mhar/sub/mod.py
    ("mhar", "def f():\n    from _glue import start", "mhar/ imports _glue.start"),
    ("mhar", "import importlib\nm = importlib.import_module('eval.run')", "mhar/ imports eval.run"),
    ("eval", "from workflow.scripts import _glue", "eval/ imports workflow.scripts._glue"),
    ("eval", "import snakemake", "eval/ imports snakemake"),
])
def test_checker_finds_upward_imports(tmp_path, package, line, expect):
    (tmp_path / "mhar" / "sub").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    for d in ("mhar", "mhar/sub", "eval"):
        (tmp_path / d / "__init__.py").write_text("")
    ok = "from mhar.model.transformer import Transformer\nfrom ..config import ConfigError\n"
    (tmp_path / "mhar" / "sub" / "ok.py").write_text(ok)
    (tmp_path / "eval" / "ok.py").write_text("from mhar.runs.checkpoint import load_model\nfrom .stats import paired\n")
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
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("mhar", "eval", "_glue"):
                wanted.setdefault(node.module, set()).update(a.name for a in node.names)
    assert {"eval.cpt", "mhar.cpt", "_glue"} <= set(wanted)
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


def import_cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """Strongly connected module groups (size > 1) of the import graph of ``packages``, every import counted
    (function-level ones too); a module's import of its own parent package is not an edge."""
    mods = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {m: {t for _, imp in imported_modules(p, root) if (t := owner(imp)) and t != m
                 and not m.startswith(t + ".")} for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_analysis_has_no_import_cycles():
    assert import_cycles(ROOT, ("eval",)) == []


def test_cycle_checker_sees_function_level_imports(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "__init__.py").write_text("")
    (tmp_path / "eval" / "a.py").write_text("from .b import g\n")
    (tmp_path / "eval" / "b.py").write_text("def g():\n    from .a import f\n")
    assert import_cycles(tmp_path, ("eval",)) == [["eval.a", "eval.b"]]
