"""Routing head-count sweep: loss vs H (H=1 = single-head AttnRes), paired delta vs the smallest H."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mhar.model.presets import size_key

from .. import verdict as vd
from ..load.common import AnalysisInputError
from mhar.runs.sidecar import provenance
from ..load.published import check_source, load_published, paper_scale, published_value, source_notes
from ..load.runs import load_summaries
from .rows import group_runs, knobs_text, shown_knobs
from .pairs import judge, pair_groups, seeds_text, unpaired_reason
from .render import Column, JUDGE_COLS, P_COLS, RULE_POINTER, Table, f_ci, f_num, f_sd, paired_cols, with_scale
from .registry import TABLES, Build


# What the sweep compares (the paper's head sweep): MHAR at each H, and single-head AttnRes as its H=1.
SWEPT = ("mhar", "attnres")


def heads_table(summaries: Sequence[str | Path], published=None, source: Optional[str] = None,
                table1_source: Optional[str] = None) -> Table:
    """Routing head-count sweep: loss vs H (H=1 = AttnRes), paired delta vs the smallest H (seeds = unit).
    Published: ``source``'s 1B sweep (default TABLES["heads"].source) for 1B and sizes that are not paper
    scales, ``table1_source``'s H=1/8/16 (default TABLES["table1"].source) for the other paper scales."""
    pub = load_published() if published is None else published
    sources = {"heads": check_source(pub, source or TABLES["heads"].source),
               "table1": check_source(pub, table1_source or TABLES["table1"].source)}
    groups = group_runs(load_summaries(summaries))
    by_size: dict[tuple, dict[int, dict]] = {}  # one sweep per size and residual knobs (besides H)
    shown = shown_knobs([g for g in groups if g[0] in SWEPT], by_variant=False)
    for (variant, size, heads, _), runs in groups.items():
        if variant in SWEPT:
            h, knobs = (heads if heads is not None else 1), shown[(variant, size, heads, _)]
            if h in by_size.setdefault((size, knobs), {}):
                raise AnalysisInputError(f"size {size}: both attnres and mhar H=1 runs given; pass one of them")
            by_size[(size, knobs)][h] = runs
    rows, results, unpaired = [], [], []
    for size, knobs in sorted(by_size, key=lambda sk: (*size_key(sk[0]), str(sk[1]))):
        hs = by_size[(size, knobs)]
        ref_h = min(hs)
        if len(hs) == 1:  # a sweep of one H: nothing to compare with; the nearest other H (same knobs) says why
            others = [r for (s2, k2), hs2 in by_size.items() if s2 != size and k2 == knobs
                      for h2, r in hs2.items() if h2 != ref_h]
            unpaired.append(unpaired_reason(hs[ref_h], others, "run of another head count"))
        scale, same = paper_scale(size)
        ptab = "heads" if scale == "1B" or not same else "table1"
        pscale = "1B" if ptab == "heads" else scale
        pub_of = lambda h: published_value(pub, sources[ptab], pscale, "attnres" if (h == 1 and ptab == "table1") else "mhar",  # noqa: E731
                                              "tail_mean_val_loss", heads=h)
        means = {h: float(np.mean([r.tail_mean_val_loss for r in runs.values()])) for h, runs in hs.items()}
        best = min(means, key=means.get)
        for h in sorted(hs):
            losses = np.array([r.tail_mean_val_loss for r in hs[h].values()])
            res, seeds = None, sorted(hs[h])
            if h != ref_h:
                seeds, a, b = pair_groups(hs[h], hs[ref_h])
                res = vd.seed_evidence(a, b)
            pl, pref = pub_of(h), pub_of(ref_h)
            pdelta = pl - pref if (pl is not None and pref is not None and h != ref_h) else None
            rows.append({"size": size, "heads": h, "residual": knobs_text(knobs), "seeds": seeds_text(seeds),
                         "n_seeds": len(losses),
                         "loss_mean": float(losses.mean()),
                         "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
                         "best": h == best, "interior_best": best not in (min(hs), max(hs)),
                         "published_loss": pl, "published_table": f"{ptab}:{pscale}", "published_source": sources[ptab], "published_scale": pscale,
                         "published_delta": pdelta, "same_scale": same, "test": res.method if res else None,
                         "comparison": "" if h == ref_h else f"H={h} - H={ref_h} ({size}"
                                       + (f", {knobs_text(knobs)})" if knobs else ")"), **paired_cols(res)})
            results.append(res)
    judge(rows, results)
    cols = [Column("size", lambda r: r["size"]),
            Column("H", lambda r: str(r["heads"]) + (f" ({r['residual']})" if r["residual"] else "")
                   + (" *" if r["best"] else "")),
            Column("seeds", lambda r: r["seeds"]),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs smallest H [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS), Column("paper loss", lambda r: with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: with_scale(f_ci(r["published_delta"], None, None), r)),
            *(c() for c in JUDGE_COLS)]
    notes = ["* = lowest mean loss; the paper's U-shape means the best H is interior (neither the smallest nor "
             "the largest H swept).", "Unit: the seed (paired t over seeds vs the smallest H).",
             "H=1 is single-head AttnRes. Paper: 1B head sweep (8 KV heads) for 1B and "
             "non-paper sizes, Table 1 (H=1/8/16) for 100M/350M.", vd.SCALE_NOTE, RULE_POINTER,
             *(n for k in sorted({r["published_table"].split(":")[0] for r in rows})
               for n in source_notes(sources[k], []))]
    return Table("heads", "Routing head-count sweep", rows, cols, notes, provenance(summaries), unpaired)


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table heads (analysis.tables.registry)."""
    return heads_table(inputs, source=b.source("heads"), table1_source=b.source("table1"))
