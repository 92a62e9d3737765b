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
from .rows import variant_label


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


def seeds_text(seeds: Sequence[int]) -> str:
    return " ".join(map(str, seeds))
