"""Table rows: a row's label (the variant's display name, its head count, the knobs off their defaults) and the
grouping of runs into rows (the runs of one row differ only by seed, ``mhar.runs.pairing``)."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Iterable, Optional, Sequence

from mhar.model.config import ResidualConfig
from mhar.runs.pairing import pairing_difference

from ..load.common import AnalysisInputError
from ..load.runs import RunSummary, describe_run


def shown_knobs(keys: Iterable[tuple], by_variant: bool = True) -> dict[tuple, tuple]:
    """For group keys (variant, size, heads, knobs): the knobs each row names, i.e. every knob that is off its
    default in some row of the same variant (of any variant with ``by_variant=False``), with this row's value,
    so two rows that differ in a knob both show it (hyper_n=2 and hyper_n=4)."""
    keys = list(keys)
    defaults = {f.name: f.default for f in fields(ResidualConfig)}
    names: dict[str, set] = {}
    for k in keys:
        names.setdefault(k[0] if by_variant else "", set()).update(n for n, _ in k[3])
    return {k: tuple((n, dict(k[3]).get(n, defaults.get(n))) for n in sorted(names[k[0] if by_variant else ""]))
            for k in keys}


def knobs_text(knobs: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs)


def variant_label(display: dict, heads: Optional[int], knobs: tuple = ()) -> str:
    """A row's name: the variant's display name (with H= when its display record shows heads), then the knobs
    off their defaults."""
    name = display["display"]
    name = f"{name} H={heads}" if display.get("shows_heads") and heads is not None else name
    return f"{name} ({knobs_text(knobs)})" if knobs else name


def run_label(run: RunSummary, knobs: Optional[tuple] = None) -> str:
    """``run``'s row name, with ``knobs`` (default: its own knobs off their defaults)."""
    return variant_label(run.display, run.heads, run.knobs if knobs is None else knobs)


def ident_label(ident: dict) -> str:
    """The row name of a run identity (run_identity's dict)."""
    return variant_label(ident["display"], ident["heads"], ident["knobs"])


def check_row(members: Sequence[tuple[dict, Any]]) -> None:
    """The runs of one table row (same residual config and size) must differ only by their seeds; otherwise one
    AnalysisInputError naming two runs and the first field that differs."""
    (i0, w0), rest = members[0], members[1:]
    for i, w in rest:
        diff = pairing_difference(i0, i, ignore=("train.seed", "data.seed"))
        if diff is not None:
            raise AnalysisInputError(f"{describe_run(i0, w0)} and {describe_run(i, w)} are runs of one row "
                                     f"({ident_label(i0)}) but their resolved "
                                     f"configs differ in {diff}; a row pools seeds of one config only: pass "
                                     "runs of one config")


def group_runs(runs: Sequence[RunSummary]) -> dict[tuple, dict[int, RunSummary]]:
    """{(residual variant, size, heads, knobs): {seed: run}}; the runs of a group differ only by seed."""
    out: dict[tuple, dict[int, RunSummary]] = {}
    for r in runs:
        g = out.setdefault(r.group, {})
        if r.seed in g:
            o = g[r.seed]
            diff = pairing_difference(o.ident, r.ident, ignore=()) or "nothing (the same config twice)"
            raise AnalysisInputError(
                f"{r.path} and {o.path}: two runs of {run_label(r)} {r.size} seed {r.seed} (labels {r.name!r} vs "
                f"{o.name!r}) whose resolved configs differ in {diff}; pass one run per seed and residual config")
        g[r.seed] = r
    for g in out.values():
        check_row([(r.ident, r.run_dir) for _, r in sorted(g.items())])
    return out
