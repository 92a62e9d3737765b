"""Seed table: per-seed paired deltas vs the baseline (descriptive; the test is Table 1's)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import stats as st
from mhar.runs.sidecar import provenance
from ..load.published import (check_source, load_published, other_values, others_text, paper_scale,
                              published_sd, published_value, source_notes)
from ..load.runs import load_summaries
from .rows import group_runs, knobs_text, run_label, shown_knobs
from .pairs import is_baseline_of, no_baseline, ordered, pair_groups, reference_group, seeds_text
from .render import Column, Table, f_num, f_sd, with_scale
from .registry import TABLES, Build


def seeds_table(summaries: Sequence[str | Path], published=None, source: Optional[str] = None) -> Table:
    """Per-seed paired deltas vs baseline (descriptive), against the paper's seed table. The test and the
    verdict of these very deltas are Table 1's (same runs, same test): not repeated, so not counted twice.
    ``source``: the published source quoted (default TABLES["seeds"].source)."""
    pub = load_published() if published is None else published
    source = check_source(pub, source or TABLES["seeds"].source)
    disagree = []
    groups = group_runs(load_summaries(summaries))
    rows, unpaired = [], []
    shown = shown_knobs(groups)
    for g in ordered(groups):
        variant, size, heads, _ = g
        knobs = shown[g]
        ref = reference_group(groups, g, is_baseline_of(size)) if variant != "baseline" else None
        if ref is None:
            if variant != "baseline":
                unpaired.append(no_baseline(groups, g))
            continue
        seeds, a, b = pair_groups(groups[g], groups[ref])
        d = a - b
        scale, same = paper_scale(size)
        pd_ = published_value(pub, source, scale, variant, "delta_vs_baseline")
        psd = published_sd(pub, source, scale, variant, "delta_vs_baseline") if pd_ is not None else None
        others = other_values(pub, source, scale, variant, "delta_vs_baseline")
        label = run_label(next(iter(groups[g].values())), knobs)
        if others and pd_ is not None:
            disagree.append(f"{variant} {scale}: {source} {pd_:+.4g}; {others_text(others)}")
        rows.append({"size": size, "variant": variant, "heads": heads, "method": label, "residual": knobs_text(knobs),
                     "run_label": ",".join(sorted({r.name for r in groups[g].values()})),
                     "seeds": seeds_text(seeds),
                     "n_pairs": len(seeds), "per_seed_delta": " ".join(f"{x:+.4f}" for x in d),
                     "delta": float(d.mean()), "delta_sd": float(d.std(ddof=1)) if d.size > 1 else None,
                     "pairing_corr": float(np.corrcoef(a, b)[0, 1]) if d.size > 2 and a.std() > 0 and b.std() > 0 else None,
                     "mde80": st.mde_paired(len(seeds), float(d.std(ddof=1))) if d.size > 1 else None,
                     "published_delta": pd_, "published_sd": psd, "same_scale": same, "published_scale": scale,
                     "published_source": source, "published_others": others_text(others),
                     "comparison": f"{label} - baseline ({size}, seeds)"})
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]), Column("per-seed Δ", lambda r: r["per_seed_delta"]),
            Column("mean Δ ± sd", lambda r: f_sd(r["delta"], r["delta_sd"])),
            Column("MDE (80%)", lambda r: f_num(r.get("mde80"))),
            Column("paper Δ ± sd", lambda r: with_scale(f_sd(r["published_delta"], r["published_sd"]), r))]
    notes = ["Paired by seed (data order). sd = per-seed sd of the paired differences; MDE = smallest |Δ| a "
             "two-sided paired t-test with these seeds detects with 80% power at alpha 0.05.",
             "Descriptive: the test and verdict of these deltas are in Table 1 (same runs, same paired t), so each "
             "result is counted once.",
             "Paper: seed table of the FineWeb-Edu replication (3 seeds).", *source_notes(source, disagree)]
    return Table("seeds", "Seed table: per-seed paired deltas vs baseline", rows, cols, notes,
                 provenance(summaries), unpaired)


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table seeds (analysis.tables.registry)."""
    return seeds_table(inputs, source=b.source("seeds"))
