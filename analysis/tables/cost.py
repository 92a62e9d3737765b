"""Cost table: throughput and memory per routing implementation and size (benchmark CSVs)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from mhar.model.choices import ROUTING_IMPLS
from mhar.model.presets import size_key

from .. import verdict as vd
from ..load.bench import load_bench, load_inference
from mhar.runs.sidecar import provenance
from ..load.published import check_source, load_published, paper_scale, published_value, source_notes
from .render import Column, Table, f_num, f_sd, is_number
from .registry import TABLES, Build


# --- cost ---------------------------------------------------------------------------------------------
AUTHORS_KERNEL = "authors"  # the row of the authors' kernel, measured side by side with ours (issue 56)
# The rows the table shows, in its order: the baseline, the routing paths a user runs today (every name of
# mhar.model.choices.ROUTING_IMPLS; fused_nopdl: the fused kernels under their documented setting MHAR_ROUTING_PDL=0,
# a variant of benchmarks/bench_training.py) and the authors' kernel. Any other name in a record is a withdrawn
# kernel experiment: its records stay in results/bench (history) and leave the table and figure (a note counts them).
ROUTING_ROWS = ("baseline", "eager", "compile", "fused", "fused_nopdl",
                *(i for i in ROUTING_IMPLS if i not in ("eager", "compile", "fused")), AUTHORS_KERNEL)


def todays_rows(df) -> tuple[pd.DataFrame, list[str]]:
    """(the benchmark rows of ROUTING_ROWS, one 'name (n records)' per withdrawn kernel left out)."""
    keep = df["provider"].isin(ROUTING_ROWS)
    gone = df.loc[~keep, "provider"].value_counts()
    counts = [f"{name} ({n} record{'s' if n > 1 else ''})" for name, n in sorted(gone.items())]
    return df[keep].reset_index(drop=True), counts


def _mean_se(x) -> tuple[Optional[float], Optional[float], int]:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return None, None, 0
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None), int(x.size)


def cost_table(bench_csvs: Sequence[str | Path], published=None, source: Optional[str] = None) -> Table:
    """Throughput (ratio to baseline) and peak memory per routing implementation and size. ``source``: the
    published source quoted (default TABLES["cost"].source)."""
    pub = load_published() if published is None else published
    source = check_source(pub, source or TABLES["cost"].source)
    df, withdrawn = todays_rows(load_bench(bench_csvs))
    inf = _table_inference_rows(load_inference(bench_csvs))
    inf_base = {size: sub for size, sub in inf[inf["provider"] == "baseline"].groupby("size")}
    prov_order = {p: i for i, p in enumerate(ROUTING_ROWS)}
    base_tps = {size: _mean_se(sub.loc[sub["provider"] == "baseline", "tokens_per_s"])
                for size, sub in df.groupby("size")}
    rows = []
    for (size, provider), sub in sorted(df.groupby(["size", "provider"]),
                                        key=lambda kv: (*size_key(kv[0][0]),
                                                        prov_order.get(kv[0][1], 99), kv[0][1])):
        tps_m, tps_se, n_ok = _mean_se(sub["tokens_per_s"])
        r, r_se, _ = _mean_se(sub["ratio"])
        bm, bse, _ = base_tps.get(size, (None, None, 0))
        ok = sub["ratio"].notna()
        paired = provider != "baseline" and bool(ok.any()) and bool(sub.loc[ok, "paired"].all())
        # paired: every ratio pairs a run with its own baseline, so r and r_se are the mean and SE over runs
        if not paired and r is not None and tps_m and bm and (tps_se is not None or bse is not None):
            # delta method: spread of the variant and of the baseline repeats
            r_se = r * math.sqrt(((tps_se or 0.0) / tps_m) ** 2 + ((bse or 0.0) / bm) ** 2)
        mem = sub["peak_mem_gb"].astype(float)
        scale, same = paper_scale(size)
        pr = published_value(pub, source, scale, provider, "throughput_ratio") if same else None
        pm = published_value(pub, source, scale, provider, "peak_mem_gb") if same else None
        bad = sorted(set(sub["status"].astype(str)) - {"ok", "nan"})
        status = ",".join(bad) or "ok"
        oom = n_ok == 0 and any(b.upper() == vd.OOM for b in bad)
        v = "" if provider == "baseline" else vd.cost_verdict(r, pr, same, se=r_se, status=vd.OOM if oom else "ok")
        rows.append({"size": size, "provider": provider, "n": len(sub), "n_ok": n_ok, "status": status,
                     "tokens_per_s": tps_m, "tokens_per_s_sd": float(sub["tokens_per_s"].astype(float).std(ddof=1))
                     if n_ok > 1 else None,
                     "ratio": r, "ratio_se": r_se,
                     "pairing": "" if provider == "baseline" else ("same run" if paired else "mean baseline"),
                     "peak_mem_gb": float(mem.mean()) if mem.notna().any() else None,
                     "published_ratio": pr, "published_mem_gb": pm, "same_scale": same, "published_source": source,
                     "comparison": "" if provider == "baseline" else f"{provider} / baseline throughput ({size})",
                     "delta": (r - 1.0) if (r is not None and provider != "baseline") else None,
                     "published_delta": (pr - 1.0) if (pr is not None and provider != "baseline") else None,
                     "verdict": v, "sources": ";".join(sorted(set(sub["source"])))})
        rows[-1].update(_inference_cols(inf, inf_base, size, provider))
    cols = [Column("size", lambda r: r["size"]), Column("routing", lambda r: r["provider"]),
            Column("n", lambda r: str(r["n_ok"])),
            Column("tokens/s", lambda r: f_sd(r["tokens_per_s"], r["tokens_per_s_sd"], 0)
                   if is_number(r["tokens_per_s"]) else r["status"]),
            Column("ratio ± SE", lambda r: f_sd(r["ratio"], r["ratio_se"], 3) if is_number(r["ratio"]) else
                   (vd.OOM if vd.OOM in r["status"].upper() else "-")),
            Column("ratio vs", lambda r: r["pairing"] or "-"),
            Column("peak GB", lambda r: f_num(r["peak_mem_gb"], 1)),
            Column("paper ratio", lambda r: f_num(r["published_ratio"], 2)),
            Column("paper GB", lambda r: f_num(r["published_mem_gb"], 1)),
            Column("verdict", lambda r: r["verdict"] or "-")]
    scored = bool(len(inf)) and bool(inf["score_tok_s"].notna().any())
    if scored:
        cols[-1:-1] = [Column("score tok/s (ratio)", lambda r: f"{f_num(r['score_tok_s'], 0)} "
                              f"({f_num(r['score_ratio'], 2)})" if is_number(r.get("score_tok_s")) else "-")]
    if len(inf):
        cols[-1:-1] = [Column("prefill tok/s (ratio)", lambda r: f"{f_num(r['prefill_tok_s'], 0)} "
                              f"({f_num(r['prefill_ratio'], 2)})" if is_number(r.get("prefill_tok_s")) else "-"),
                       Column("decode ms/token (ratio)", lambda r: f"{f_num(r['decode_ms'], 1)} "
                              f"({f_num(r['decode_ratio'], 2)})" if is_number(r.get("decode_ms")) else "-"),
                       Column("inference peak GB", lambda r: f_num(r.get("infer_peak_gb"), 2))]
    notes = ["ratio vs 'same run': each record's ratio pairs the routing implementation with the baseline "
             "measured in the same run (benchmarks/bench_training.py); the table gives the mean over runs and its "
             "SE over runs (n runs). ratio vs 'mean baseline': tokens/s of the routing implementation / mean "
             "tokens/s of the baseline at the same size, SE from the repeats of both (delta method). Memory as the "
             "benchmark reports it (torch peak allocated).",
             "Paper: cost table (single H100); eager 1B was OOM (>80 GB).",
             "Verdicts: analysis/verdict.py COST_RULE (quoted once at the top of REPORT.md): two-sided tolerance 0.10 "
             "plus 2 SE of the repeats.", *source_notes(source, [])] + \
        (["Inference (benchmarks/bench_inference.py at batch 8; not in the paper, no verdict): "
          + ("scoring tok/s (the lm-eval adapter's path, mhar.model.inference.Scorer) and its ratio to the baseline, "
             if scored else "") +
          "prefill tok/s and its ratio to the baseline, decode ms per generated token (Transformer.generate, "
          "whole batch) and its ratio to the baseline (> 1 = slower), inference peak memory."]
         if len(inf) else []) + \
        _hf_notes(inf) + \
        ([f"Withdrawn kernel experiments left out (records kept in the benchmark CSVs): {', '.join(withdrawn)}."]
         if withdrawn else []) + \
        [f"skipped: {s}" for s in df.attrs.get("skipped", [])]
    return Table("cost", "Cost: throughput and memory by routing implementation", rows, cols, notes,
                 provenance(bench_csvs))


def _table_inference_rows(inf):
    """The inference rows the cost table shows: batch 8 (the table's shape; records without a batch column
    count as 8), and per size only the newest record format (rows with the scoring column) when it exists, so
    figures of two versions of the benchmark are never averaged."""
    if not len(inf):
        return inf
    inf = inf[inf["batch"].fillna(8) == 8]
    keep = []
    for _, sub in inf.groupby("size"):
        keep.append(sub[sub["score_tok_s"].notna()] if sub["score_tok_s"].notna().any() else sub)
    return pd.concat(keep, ignore_index=True) if keep else inf


def _hf_notes(inf) -> list[str]:
    """One note per size with transformers' Qwen3 measured beside the baseline (same run, same shapes)."""
    out = []
    for size, sub in inf.groupby("size"):
        hf, base = sub[sub["provider"] == "hf"], sub[sub["provider"] == "baseline"]
        if not len(hf) or not len(base):
            continue
        sc = (f"scoring {f_num(base['score_tok_s'].mean(), 0)} vs {f_num(hf['score_tok_s'].mean(), 0)} tok/s, "
              if base["score_tok_s"].notna().any() else "")
        out.append(f"{size}: baseline vs transformers' Qwen3ForCausalLM (SDPA, eager generate) at the same shapes: "
                   f"{sc}decode {f_num(base['decode_ms_per_token'].mean(), 2)} vs "
                   f"{f_num(hf['decode_ms_per_token'].mean(), 2)} ms/token, peak "
                   f"{f_num(base['peak_mem_gb'].mean(), 2)} vs {f_num(hf['peak_mem_gb'].mean(), 2)} GB.")
    return out


def _inference_cols(inf, inf_base: dict, size: str, provider: str) -> dict:
    """Mean inference figures of (size, provider) and their ratios to the baseline's, or {} when not measured."""
    sub = inf[(inf["size"] == size) & (inf["provider"] == provider)]
    if not len(sub):
        return {}
    score = float(sub["score_tok_s"].mean()) if sub["score_tok_s"].notna().any() else None
    out = {"prefill_tok_s": float(sub["prefill_tok_s"].mean()), "decode_ms": float(sub["decode_ms_per_token"].mean()),
           "infer_peak_gb": float(sub["peak_mem_gb"].mean()) if sub["peak_mem_gb"].notna().any() else None,
           "score_tok_s": score, "prefill_ratio": None, "decode_ratio": None, "score_ratio": None}
    base = inf_base.get(size)
    if base is not None:
        out["prefill_ratio"] = out["prefill_tok_s"] / float(base["prefill_tok_s"].mean())
        out["decode_ratio"] = out["decode_ms"] / float(base["decode_ms_per_token"].mean())
        if score is not None and base["score_tok_s"].notna().any():
            out["score_ratio"] = score / float(base["score_tok_s"].mean())
    return out


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table cost (analysis.tables.registry)."""
    return cost_table(inputs, source=b.source("cost"))
