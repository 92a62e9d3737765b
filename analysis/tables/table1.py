"""Table 1: tail-mean validation loss per variant and size, paired delta vs the baseline (seeds = unit)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import stats as st
from .. import verdict as vd
from mhar.runs.sidecar import provenance
from ..load.published import (check_source, load_published, other_values, others_text, paper_scale,
                              published_value, source_notes)
from ..load.runs import load_summaries
from .rows import group_runs, knobs_text, run_label, shown_knobs
from .pairs import is_baseline_of, judge, no_baseline, ordered, pair_groups, reference_group, seeds_text
from .render import Column, JUDGE_COLS, P_COLS, RULE_POINTER, Table, f_ci, f_num, f_sd, paired_cols, with_scale
from .registry import TABLES, Build


def _published_heads(variant: str, heads: Optional[int]) -> Optional[int]:
    """The published row's H for our run: MHAR with an H the paper did not run is compared with its headline
    H=8 row (noted in the table); variants without routing heads match on the method alone."""
    if variant == "mhar" and heads not in (8, 16):
        return 8
    return heads if variant in ("mhar", "attnres") else None


def _published_loss(pub, source: str, size: str, variant: str,
                    heads: Optional[int]) -> tuple[Optional[float], Optional[float], bool, dict]:
    """(published loss of this variant, published delta vs baseline, same scale, other sources' losses)."""
    scale, same = paper_scale(size)
    base = published_value(pub, source, scale, "baseline", "tail_mean_val_loss")
    h = _published_heads(variant, heads)
    v = published_value(pub, source, scale, variant, "tail_mean_val_loss", heads=h)
    if v is None and h is not None:  # a source that does not state the head count of its row
        h = None
        v = published_value(pub, source, scale, variant, "tail_mean_val_loss")
    others = other_values(pub, source, scale, variant, "tail_mean_val_loss", heads=h)
    if variant == "baseline":
        return base, None, same, others
    return v, (v - base if v is not None and base is not None else None), same, others


def table1(summaries: Sequence[str | Path], published=None, source: Optional[str] = None) -> Table:
    """Tail-mean validation loss, variant x size: mean ± sd over seeds, paired delta vs baseline (seeds = unit).
    ``source``: the published source quoted (default TABLES["table1"].source)."""
    pub = load_published() if published is None else published
    source = check_source(pub, source or TABLES["table1"].source)
    disagree = []
    runs = load_summaries(summaries)
    groups = group_runs(runs)
    rows, results, unpaired = [], [], []
    shown = shown_knobs(groups)
    for g in ordered(groups):
        variant, size, heads, _ = g
        knobs = shown[g]
        byseed = groups[g]
        losses = np.array([r.tail_mean_val_loss for r in byseed.values()])
        first = byseed[min(byseed)]
        row = {"size": size, "variant": variant, "heads": heads, "method": run_label(first, knobs),
               "residual": knobs_text(knobs), "seeds": seeds_text(sorted(byseed)), "n_seeds": len(byseed),
               "loss_mean": float(losses.mean()), "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
               "pairing": ",".join(sorted({r.pairing for r in byseed.values()})),
               "run_label": ",".join(sorted({r.name for r in byseed.values()})),
               "params": first.params, "tokens": first.tokens, "steps": first.steps, "tail_k": first.tail_k,
               **{k: first.setup.get(k) for k in ("corpus", "tokenizer", "seq_len", "hardware")}}
        pub_loss, pub_delta, same, others = _published_loss(pub, source, size, variant, heads)
        row.update(published_loss=pub_loss, published_delta=pub_delta, same_scale=same,
                   published_scale=paper_scale(size)[0], published_source=source,
                   published_others=others_text(others),
                   comparison=f"{row['method']} - baseline ({size})")
        ref = reference_group(groups, g, is_baseline_of(size)) if variant != "baseline" else None
        res = None
        if ref is None and variant != "baseline":
            unpaired.append(no_baseline(groups, g))
        if ref is not None:
            seeds, a, b = pair_groups(byseed, groups[ref])
            res = vd.seed_evidence(a, b)
            row.update(seeds=seeds_text(seeds), n_pairs=len(seeds), test=res.method,
                       mde80=st.mde_paired(len(seeds), float(np.std(a - b, ddof=1)) if len(seeds) > 1 else math.nan))
        row.update(paired_cols(res))
        if variant == "baseline":
            row["comparison"] = ""
        rows.append(row)
        results.append(res)
        if others and pub_loss is not None:
            disagree.append(f"{variant} {paper_scale(size)[0]}: {source} {pub_loss:.4g}; {others_text(others)}")
    judge(rows, results)
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs baseline [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS),
            Column("paper loss", lambda r: with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: with_scale(f_ci(r["published_delta"], None, None), r)),
            *(c() for c in JUDGE_COLS)]
    notes = ["Δ = variant - baseline on the same seeds (seed = data order, so runs are paired; 'seeds' lists the "
             "seeds actually paired). Unit: the seed; test: paired t over seeds (t interval); one seed gives no CI.",
             "Paper: Table 1 (anneal corpus, 20K steps); MHAR with H not in {8, 16} is compared with the paper's "
             "H=8 row.", vd.SCALE_NOTE, RULE_POINTER, *source_notes(source, disagree)]
    return Table("table1", "Table 1: tail-mean validation loss (ours vs paper)", rows, cols, notes,
                 provenance(summaries), unpaired)


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table table1 (analysis.tables.registry)."""
    return table1(inputs, source=b.source("table1"))
