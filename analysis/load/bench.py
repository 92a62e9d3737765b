"""Benchmark CSVs: training throughput (``benchmarks/bench_training.py``) and inference
(``benchmarks/bench_inference.py``) records, under today's routing-implementation names."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from .common import AnalysisInputError

_BENCH_ALIASES = {"tokens_per_s": ("tokens_per_s", "tok_per_s", "throughput", "tokens_per_sec", "tps"),
                  "peak_mem_gb": ("peak_mem_gb", "peak_mem_gib", "mem_gb", "peak_memory_gb", "memory_gb"),
                  "size": ("size", "preset", "scale", "model"),
                  "provider": ("provider", "impl", "routing", "routing_impl", "method", "variant"),
                  "ratio": ("ratio", "thr_ratio", "throughput_ratio", "rel_throughput")}
PROVIDER_NAMES = {"baseline": "baseline", "mhar_eager": "eager", "eager": "eager", "reference": "eager",
                  "mhar_compile": "compile", "compile": "compile", "mhar_fused": "fused", "fused": "fused",
                  "mhar_auto": "auto", "mhar_compile_sub": "compile"}
# bench_training variant names of rows without a routing_resolved column (the committed record
# results/bench/training.csv, measured through commit aee597a, needs it): what routing_impl fused runs was measured
# as mhar_fused_v7_sg8_pdl, and mhar_fused / mhar_fused_sub named other kernels then. Rows with a routing_resolved
# value keep their names.
RECORDED_BENCH_NAMES = {"mhar_fused_v7_sg8_pdl": "mhar_fused", "mhar_fused": "mhar_fused_v6",
                         "mhar_fused_sub": "mhar_fused_v5"}


def bench_variant(variant, routing_resolved=None) -> str:
    """A training-throughput row's variant under today's names: a row without a ``routing_resolved`` value is
    renamed by ``RECORDED_BENCH_NAMES``."""
    if isinstance(routing_resolved, str) and routing_resolved.strip():
        return str(variant)
    return RECORDED_BENCH_NAMES.get(str(variant), str(variant))


def provider_name(name) -> str:
    """The routing implementation a benchmark row names: bench_training's variants ``mhar_<routing_impl>``
    (``mhar_fused_nopdl`` -> ``fused_nopdl``; ``mhar_fused_v7_sg8`` -> ``fused_v7_sg8``) and the
    aliases above; other names lower-cased as given."""
    v = str(name).lower()
    if v in PROVIDER_NAMES:
        return PROVIDER_NAMES[v]
    return v[len("mhar_"):] if v.startswith("mhar_fused_") else v


_INFERENCE_COLS = ("size", "variant", "routing_impl", "prefill_tok_s", "decode_ms_per_token", "peak_mem_gib")


def _read_bench_csv(path: str | os.PathLike):
    """(path, DataFrame with stripped lower-case column names) of one listed benchmark CSV."""
    p = Path(path)
    if not p.is_file():
        raise AnalysisInputError(f"{p}: benchmark CSV not found (run the benchmark first)")
    df = pd.read_csv(p)
    df.columns = [c.strip().lower() for c in df.columns]
    return p, df


def _is_inference(df) -> bool:
    return "prefill_tok_s" in df.columns


def load_inference(paths: Iterable[str | os.PathLike]):
    """The inference records (``benchmarks/bench_inference.py`` CSVs) among ``paths``, one DataFrame with
    columns size, provider (baseline / hf = transformers' Qwen3 / the routing implementation), batch,
    score_tok_s (NaN in records older than the scoring column), prefill_tok_s, decode_ms_per_token, peak_mem_gb,
    source; empty when none is listed. A listed inference CSV without the core columns is an error."""
    frames = []
    for p in paths:
        p, df = _read_bench_csv(p)
        if not _is_inference(df):
            continue
        missing = [c for c in _INFERENCE_COLS if c not in df.columns]
        if missing:
            raise AnalysisInputError(f"{p}: inference record without columns {missing}: not a "
                                     "benchmarks/bench_inference.py CSV")

        def num(col: str):
            return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)

        out = pd.DataFrame({
            "size": df["size"].astype(str),
            "provider": [str(v) if str(v) in ("baseline", "hf") else provider_name(i)
                         for v, i in zip(df["variant"], df["routing_impl"])],
            "batch": num("batch"),
            "score_tok_s": num("score_tok_s"),
            "prefill_tok_s": num("prefill_tok_s"),
            "decode_ms_per_token": num("decode_ms_per_token"),
            "peak_mem_gb": num("peak_mem_gib"),
            "source": str(p)})
        frames.append(out)
    cols = ["size", "provider", "batch", "score_tok_s", "prefill_tok_s", "decode_ms_per_token", "peak_mem_gb",
            "source"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def load_bench(paths: Iterable[str | os.PathLike]):
    """Concatenate training-throughput benchmark CSVs into one DataFrame with columns size, provider
    (baseline/eager/compile/fused), tokens_per_s, peak_mem_gb, ratio (throughput / baseline throughput),
    status, source, paired (the ratio came with the record: the variant against the baseline of its own run).
    ``paths`` is an explicit list (the workflow's ``cost.bench_files``); inference records
    among them (``load_inference``) are left to the caller; any other listed CSV that is
    not a training-throughput benchmark (no throughput column, e.g. routing-op timings) is an error, not
    skipped. Memory is taken as reported (GiB when the CSV says ``peak_mem_gib``)."""
    frames = []
    for p in paths:
        p, df = _read_bench_csv(p)
        if _is_inference(df):  # benchmarks/bench_inference.py records: read by load_inference
            continue
        if "mode" in df.columns:  # bench_training.py --trainer-steps rows re-measure the same step through
            df = df[df["mode"].astype(str) != "trainer"].reset_index(drop=True)  # mhar.train: not repeats
        cols = {canon: next((a for a in aliases if a in df.columns), None) for canon, aliases in _BENCH_ALIASES.items()}
        if cols["tokens_per_s"] is None:
            raise AnalysisInputError(f"{p}: no tokens_per_s column (or one of {_BENCH_ALIASES['tokens_per_s']}): "
                                     "not a training-throughput benchmark; list only benchmarks/bench_training.py "
                                     "CSVs (cost.bench_files)")
        for canon in ("size", "provider"):
            if cols[canon] is None:
                raise AnalysisInputError(f"{p}: needs a column {canon!r} (or one of {_BENCH_ALIASES[canon]}); "
                                         f"has {list(df.columns)}")
        out = pd.DataFrame(index=df.index)
        for canon, col in cols.items():
            out[canon] = df[col] if col is not None else np.nan
        out["status"] = df["status"].astype(str) if "status" in df.columns else "ok"
        out["tokens_per_s"] = pd.to_numeric(out["tokens_per_s"], errors="coerce")
        if cols["provider"] == "variant":  # bench_training's variant names (older records: bench_variant)
            resolved = df["routing_resolved"] if "routing_resolved" in df.columns else [None] * len(df)
            out["provider"] = [bench_variant(v, r) for v, r in zip(out["provider"], resolved)]
        out["provider"] = [provider_name(v) for v in out["provider"]]
        out["size"] = out["size"].astype(str)
        out["source"] = str(p)
        frames.append(out)
    if not frames:
        raise AnalysisInputError("no training-throughput CSV given: list benchmarks/bench_training.py CSVs "
                                 "(cost.bench_files)")
    df = pd.concat(frames, ignore_index=True)
    df["ratio"] = pd.to_numeric(df["ratio"], errors="coerce")
    # a ratio the record carries pairs the variant with the baseline of its own run (bench_training.py's
    # thr_ratio); a missing one is filled against the mean baseline of the size: not paired
    df["paired"] = df["ratio"].notna() & (df["provider"] != "baseline")
    for size, sub in df.groupby("size"):
        base = sub.loc[sub["provider"] == "baseline", "tokens_per_s"].astype(float).mean()
        missing = sub["ratio"].isna()
        if np.isfinite(base) and base > 0:
            df.loc[sub.index[missing], "ratio"] = sub.loc[missing, "tokens_per_s"].astype(float) / base
    return df

