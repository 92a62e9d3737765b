"""The model package's own files, flattened into a Hugging Face model folder.

transformers' ``trust_remote_code`` loader copies a model folder's ``modeling_*.py`` together with the files
it imports as ``from .name import ...`` (flat names, one folder, no packages). An export therefore ships the
harness's modules verbatim, each under its dotted name with ``_`` for ``.`` (``mhar.model.residuals.routed``
-> ``mhar_model_residuals_routed.py``), with one change: every import of another shipped module becomes the
flat relative import (``from mhar.model.config import X`` -> ``from .mhar_model_config import X``).

Which modules: the closure of every import (module level and inside functions), read from the source with
``ast``, starting at :mod:`mhar.hf.modeling_mhar` (shipped as ``modeling_mhar.py``), the modules of the
residual registry's package (what its ``pkgutil`` discovery imports) and the model's own variant module when
it lives outside ``mhar`` (the module its registered class comes from; modules of that module's top-level package are followed
too). A module that needs Triton when it is imported (a top-level ``import triton``, or a top-level import of
such a module: the fused routing kernels) is not shipped: it stays an absolute ``mhar`` import, reached only
where ``mhar`` is installed (the export's ``routing_impl: auto`` on a GPU). The flat copy of the registry is
not a package, so its discovery finds nothing there: the export appends one import per shipped variant module.
"""
from __future__ import annotations

import ast
import importlib.util
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mhar.model.residuals import RESIDUALS

ENTRY = "mhar.hf.modeling_mhar"
ENTRY_FILE = "modeling_mhar"
REGISTRY = "mhar.model.residuals"
_FROM = re.compile(r"from\s+\.*[\w.]*")


class ShipError(RuntimeError):
    """A module cannot be shipped as a flat file (the message names it and the import)."""


def flat_name(module: str) -> str:
    """The file stem a shipped module gets in the model folder."""
    return ENTRY_FILE if module == ENTRY else module.replace(".", "_")


def _source(module: str) -> tuple[Path, str, bool]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ShipError(f"cannot ship {module!r}: no Python source file found for it")
    return Path(spec.origin), Path(spec.origin).read_text(encoding="utf-8"), spec.submodule_search_locations is not None


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


@dataclass
class _Import:
    node: ast.AST
    target: str  # the module the statement imports from
    top_level: bool  # executed when the importing module is imported (not inside a function or a try block)


def _imports(module: str, tree: ast.Module, is_pkg: bool) -> list[_Import]:
    """Every import statement of ``module``, resolved to absolute module names."""
    found: list[_Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Try, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(_Import(child, a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module if is_pkg else module.rpartition(".")[0]
                    base = importlib.util.resolve_name("." * child.level + base, package)
                found.append(_Import(child, base, top))
            visit(child, inner)

    visit(tree, True)
    return found


@dataclass
class Shipment:
    """The flat files of one export: name -> text, in import order; ``optional``: unshipped Triton modules."""

    files: dict[str, str] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    optional: set[str] = field(default_factory=set)


class _Planner:
    def __init__(self, roots: set[str]):
        self.roots = roots
        self.parsed: dict[str, tuple[str, ast.Module, list[_Import]]] = {}
        self._needs_triton: dict[str, bool] = {}

    def ours(self, module: str) -> bool:
        return module.split(".")[0] in self.roots

    def parse(self, module: str):
        if module not in self.parsed:
            _, text, is_pkg = _source(module)
            tree = ast.parse(text)
            self.parsed[module] = (text, tree, _imports(module, tree, is_pkg))
        return self.parsed[module]

    def needs_triton(self, module: str) -> bool:
        if module not in self._needs_triton:
            self._needs_triton[module] = False  # an import cycle does not make a module need Triton
            self._needs_triton[module] = any(
                imp.top_level and (imp.target.split(".")[0] == "triton"
                                   or (self.ours(imp.target) and self.needs_triton(imp.target)))
                for imp in self.parse(module)[2])
        return self._needs_triton[module]

    def check_form(self, module: str, imp: _Import) -> None:
        where = f"{module} (line {imp.node.lineno})"
        if isinstance(imp.node, ast.Import):
            raise ShipError(f"{where}: `import {imp.target}` cannot become a flat relative import; write "
                            f"`from {imp.target} import name`")
        for alias in imp.node.names:
            if _is_package(imp.target) and importlib.util.find_spec(f"{imp.target}.{alias.name}") is not None:
                raise ShipError(f"{where}: `from {imp.target} import {alias.name}` imports a module, which a flat "
                                f"model folder cannot hold; import names from {imp.target}.{alias.name} instead")


def variant_module(variant: str) -> Optional[str]:
    """The module that registers ``variant`` when it lives outside the registry's package (None: built in)."""
    module = RESIDUALS[variant].__module__
    return None if module.startswith(REGISTRY + ".") else module


def plan(outside: Optional[str] = None) -> Shipment:
    """The files an export ships when its variant is defined in module ``outside`` (None: in the registry's
    package; see :func:`variant_module`)."""
    roots = {"mhar"} | ({outside.split(".")[0]} if outside else set())
    planner = _Planner(roots)
    registry_path = Path(_source(REGISTRY)[0]).parent
    variants = [f"{REGISTRY}.{m.name}" for m in pkgutil.iter_modules([str(registry_path)]) if not m.name.startswith("_")]
    if outside and outside not in variants:
        variants.append(outside)
    out = Shipment()
    queue, seen = [ENTRY, *variants], set()
    while queue:
        module = queue.pop(0)
        if module in seen:
            continue
        seen.add(module)
        out.modules.append(module)
        for imp in planner.parse(module)[2]:
            if not planner.ours(imp.target):
                continue
            if planner.needs_triton(imp.target):
                out.optional.add(imp.target)
                continue
            planner.check_form(module, imp)
            queue.append(imp.target)
    names = [flat_name(m) for m in out.modules]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ShipError(f"two shipped modules flatten to the same file name: {', '.join(dup)}")
    for module in out.modules:
        text, tree, imports = planner.parse(module)
        text = _rewrite(text, [i for i in imports if planner.ours(i.target) and i.target not in out.optional])
        if module == REGISTRY:
            text += _variant_imports(planner, variants)
        out.files[flat_name(module) + ".py"] = text
    return out


def _rewrite(text: str, imports: list[_Import]) -> str:
    """``text`` with each of ``imports`` (``from`` statements of shipped modules) made flat and relative."""
    lines = text.splitlines(keepends=True)
    for imp in sorted(imports, key=lambda i: (i.node.lineno, i.node.col_offset), reverse=True):
        row, col = imp.node.lineno - 1, imp.node.col_offset
        line = lines[row]
        m = _FROM.match(line, col)
        if m is None:  # pragma: no cover - ast positions always start at the keyword
            raise ShipError(f"cannot rewrite the import on line {imp.node.lineno}: {line.strip()}")
        lines[row] = f"{line[:col]}from .{flat_name(imp.target)}{line[m.end():]}"
    return "".join(lines)


def _variant_imports(planner: _Planner, variants: list[str]) -> str:
    """The block appended to the flat registry: one import per shipped variant module (it registers its variants)."""
    lines = ["\n\n# Appended by mhar.hf.ship: this flat copy is not a package, so the discovery above finds no\n",
             "# modules; the variant modules shipped beside it register their variants here.\n"]
    for module in variants:
        tree = planner.parse(module)[1]
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.decorator_list] or \
                [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        if not names:
            raise ShipError(f"variant module {module} defines no class or function to import")
        lines.append(f"from .{flat_name(module)} import {names[0]}  # noqa: E402,F401\n")
    return "".join(lines)


def write_shipped(folder: Path, variant: str) -> list[str]:
    """Write the flat files an export of residual variant ``variant`` needs into ``folder``; returns their names."""
    shipment = plan(variant_module(variant))
    for name, text in shipment.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return list(shipment.files)
