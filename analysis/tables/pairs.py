"""Rows and their pairing, shared by the tables: row order, the reference row a row is compared with, the
pairing check of two runs (``mhar.runs.pairing``) and the verdicts of a family of rows."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mhar.model.presets import size_key
from mhar.runs.pairing import pairing_difference

from .. import stats as st
from .. import verdict as vd
from ..load.common import AnalysisInputError
from ..load.runs import RunSummary, describe_run
from .rows import ident_label, variant_label


def judge(rows: list[dict], results: list[Optional[st.PairedResult]], which: Optional[list[bool]] = None,
          single_seed: bool = False) -> None:
    """Holm across the family (the rows that carry a test), then the verdict of each judged row (a row's
    ``single_seed`` / ``same_scale``; ``single_seed=True``: every row is one trained model per arm)."""
    which = which or [res is not None for res in results]
    adj = vd.holm([res.p_value if (res is not None and j) else None for res, j in zip(results, which)])
    for row, res, j, pa in zip(rows, results, which, adj):
        if not j:
            continue
        row["p_holm"] = pa if math.isfinite(pa) else None
        one = single_seed or bool(row.get("single_seed"))  # one trained model per arm: the verdict is about these two models
        row["judged"] = vd.judged_on(bool(row.get("same_scale")), one)
        row["verdict"] = vd.decide(res, row.get("published_delta"), bool(row.get("same_scale")),
                                   pa if math.isfinite(pa) else None, single_seed=one)


def check_pair(a: dict, wa: Any, b: dict, wb: Any, ignore: Sequence[str] = ()) -> None:
    """Runs ``a`` and ``b`` (run_identity dicts, at ``wa`` / ``wb``) may be paired, else one AnalysisInputError
    naming both and the first field that differs."""
    diff = pairing_difference(a, b, ignore)
    if diff is not None:
        raise AnalysisInputError(
            f"cannot pair {describe_run(a, wa)} with {describe_run(b, wb)}: their resolved configs differ in "
            f"{diff}, not only in the residual section; paired runs share everything else (size, seeds, data "
            "order, schedule): train both from one config")


def pair_groups(var: dict[int, RunSummary], ref: dict[int, RunSummary]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(seeds, variant values, reference values) of two run groups that may be paired: the same seeds, and per
    seed resolved configs that differ in the residual section alone. Anything else is an AnalysisInputError
    naming both runs and the first field that differs."""
    v0, r0 = next(iter(var.values())), next(iter(ref.values()))
    if set(var) != set(ref):
        raise AnalysisInputError(
            f"cannot pair {v0.name} {v0.size} (seeds {sorted(var)}, e.g. {v0.run_dir}) with {r0.name} {r0.size} "
            f"(seeds {sorted(ref)}, e.g. {r0.run_dir}): seed sets differ; pass the same seeds for both")
    seeds = sorted(var)
    for s in seeds:
        check_pair(var[s].ident, var[s].run_dir, ref[s].ident, ref[s].run_dir)
    return (seeds, np.array([var[s].tail_mean_val_loss for s in seeds]),
            np.array([ref[s].tail_mean_val_loss for s in seeds]))


def unpaired_reason(var: dict, refs: Sequence[dict], reference: str,
                    ident: Callable[[Any], dict] = lambda r: r.ident) -> str:
    """Why the row of runs ``var`` ({seed: run}) was compared with nothing, for the table's notes and stderr:
    no row of the ``reference`` kind among ``refs`` (the groups that could have been its reference, of any size:
    e.g. every baseline), or the nearest one (same size, then a shared seed) and the first field in which the
    two runs' configs differ (mhar.runs.pairing.pairing_difference)."""
    s0 = min(var)
    v = ident(var[s0])
    name = f"{ident_label(v)} {v['size']}"
    if not refs:
        return (f"no {reference} among the inputs: {name} ({v['where']}) is not paired with anything; pass the "
                f"{reference}s trained with the same config (everything but model.residual)")
    near = sorted(refs, key=lambda g: (ident(next(iter(g.values())))["size"] != v["size"], s0 not in g))
    for g in near:
        r = ident(g.get(s0) or g[min(g)])
        diff = pairing_difference(v, r)
        if diff is not None:
            return (f"runs {describe_run(v, v['where'])} and {describe_run(r, r['where'])} differ in {diff} "
                    f"(beyond model.residual): not paired")
    r = ident(near[0][min(near[0])])
    return f"{name} ({v['where']}) and {describe_run(r, r['where'])} were not paired"


def reference_group(groups: dict[tuple, dict], key: tuple, want: Callable[[tuple], bool],
                    ident: Callable[[Any], dict] = lambda r: r.ident) -> Optional[tuple]:
    """The row that row ``key`` is compared with: among the rows ``want`` accepts (e.g. the baseline of the same
    size), the one whose runs pair with ``key``'s. None when there is no candidate; the only candidate even when
    it does not pair (pairing then names the field that differs); an error when several pair."""
    cands = [g for g in groups if g != key and want(g)]
    if len(cands) <= 1:
        return cands[0] if cands else None
    var = groups[key]
    s0 = min(var)
    ok = [g for g in cands if s0 in groups[g] and pairing_difference(ident(var[s0]), ident(groups[g][s0])) is None]
    if len(ok) == 1:
        return ok[0]
    if not ok:
        return cands[0]
    names = ", ".join(variant_label(ident(next(iter(groups[g].values())))["display"], g[2], g[3]) for g in ok)
    v = ident(var[s0])
    raise AnalysisInputError(f"{variant_label(v['display'], key[2], key[3])} {key[1]} ({v['where']}) pairs with "
                                f"{len(ok)} reference rows ({names}); pass the runs of one of them")


def ordered(groups: dict[tuple, dict], ident: Callable[[Any], dict] = lambda r: r.ident) -> list[tuple]:
    """The row keys (variant, size, heads, knobs) of ``groups`` in table order: by size (the size preset's
    order, mhar.model.presets.size_key), then the variant's recorded table order, then H and knobs."""
    def key(g: tuple) -> tuple:
        v, s, h, knobs = g
        display = ident(next(iter(groups[g].values())))["display"]
        return (*size_key(s), display.get("order", 100), v, h or 0, str(knobs))

    return sorted(groups, key=key)


def is_baseline_of(size: str) -> Callable[[tuple], bool]:
    return lambda g: g[0] == "baseline" and g[1] == size


def no_baseline(groups: dict[tuple, dict], key: tuple, ident: Callable[[Any], dict] = lambda r: r.ident) -> str:
    """Why row ``key`` found no baseline of its size to be paired with (:func:`unpaired_reason` over every
    baseline row of ``groups``)."""
    return unpaired_reason(groups[key], [groups[g] for g in groups if g[0] == "baseline"], "baseline run", ident)


def seeds_text(seeds: Sequence[int]) -> str:
    return " ".join(map(str, seeds))
