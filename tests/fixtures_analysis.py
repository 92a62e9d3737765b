"""Synthetic result files in the formats of docs/ARCHITECTURE.md, for the analysis tests.

Run dirs (summary.json, metrics.jsonl, config.yaml), eval dirs (<task>/samples.jsonl,
results.json) and benchmark CSVs with PLANTED effects, so tests can check that the tables
recover them. Not a test module itself (no test_ prefix).
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

def run_config(variant: str, size: str, seed: int, heads: Optional[int] = None, label: Optional[str] = None,
               overrides: Sequence[str] = ()):
    """The resolved run config mhar.train would record for such a run (tinyshakespeare, byte, seq_len 128)."""
    from mhar.runs.config import load_run_config

    return load_run_config(None, [f"model.preset={size}", f"model.residual.variant={variant}",
                                  f"model.residual.heads={heads if heads is not None else 1}",
                                  f"meta.name={label or variant}", f"train.seed={seed}", "data.seq_len=128",
                                  *overrides])


def run_records(variant: str, size: str, seed: int, heads: Optional[int] = None, label: Optional[str] = None,
                overrides: Sequence[str] = ()) -> tuple:
    """(run config, ``run`` block, ``display`` record) as current mhar.train records them in summary.json (and
    eval.run copies into results.json)."""
    from mhar.model.residuals import display_record
    from mhar.runs.config import run_identity

    cfg = run_config(variant, size, seed, heads, label, overrides)
    return cfg, run_identity(cfg), display_record(variant)


def write_run(root: Path, variant: str, size: str, seed: int, tail: float, heads: Optional[int] = None,
              steps: int = 200, every: int = 20, tail_k: int = 3, label: Optional[str] = None,
              root_dir: Optional[Path] = None, overrides: Sequence[str] = ()) -> Path:
    """One run dir whose validation curve ends at ``tail`` (tail-mean of the last ``tail_k`` evals).

    Like current mhar.train: config.yaml is the resolved run config (``overrides`` are run-config overrides, e.g.
    ``data.seed=7`` or ``model.residual.hyper_n=2``), summary.json carries the ``run`` block and the ``display``
    record, and the folder is ``runs/<label>/<size>/seed<k>/<rid>``; ``root_dir`` puts the run anywhere (its
    path then says nothing about the run)."""
    from mhar.safe_yaml import dump_yaml
    from mhar.runs.layout import run_relpath

    label = label or variant
    cfg, run, display = run_records(variant, size, seed, heads, label, overrides)
    d = root_dir or root / run_relpath(cfg)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(f"{variant}{size}{seed}{heads}".encode()))
    evals = list(range(every, steps + 1, every))
    curve = [tail + 2.0 * np.exp(-4 * s / steps) - 2.0 * np.exp(-4.0) + rng.normal(0, 1e-4) for s in evals]
    shift = tail - float(np.mean(curve[-tail_k:]))
    curve = [c + shift for c in curve]  # exact tail mean
    tok_per_step, s_per_step, flops_per_step = 4096, 0.05 * (1.3 if variant != "baseline" else 1.0), 1e9
    lines = []
    for s in range(1, steps + 1):
        lines.append({"split": "train", "step": s, "loss": curve[0] + 0.1, "lr": 1e-3, "grad_norm": 1.0,
                      "tokens": s * tok_per_step, "wall_s": s * s_per_step, "flops": s * flops_per_step})
        if s in evals:
            lines.append({"split": "val", "step": s, "val_loss": curve[evals.index(s)], "tokens": s * tok_per_step,
                          "wall_s": s * s_per_step, "flops": s * flops_per_step})
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    summary = {"variant": variant, "size": size, "seed": seed, "identity": run["identity"], "steps": steps,
               "tokens": steps * tok_per_step, "tail_mean_val_loss": float(np.mean(curve[-tail_k:])),
               "tail_k": tail_k, "final_val_loss": curve[-1], "val_losses": [[s, v] for s, v in zip(evals, curve)],
               "wall_s": steps * s_per_step, "flops": steps * flops_per_step, "params": 1000,
               "tokens_per_s": tok_per_step / s_per_step, "peak_mem_gb": 0.1, "run": run, "display": display}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.yaml").write_text(dump_yaml(cfg.to_dict()))
    return d / "summary.json"


def make_runs(root: Path, sizes=("tiny", "100M"), seeds=(0, 1, 2), effects: Optional[dict] = None) -> list[Path]:
    """Baseline + variants with planted paired effects; a seed shock shared by all variants (pairing)."""
    effects = effects or {("hyper", None): -0.010, ("attnres", 1): -0.020, ("mhar", 4): -0.040,
                          ("mhar", 8): -0.050, ("mhar", 16): -0.020}
    out = []
    for size in sizes:
        base_level = {"tiny": 4.0, "100M": 3.1}.get(size, 3.5)
        for seed in seeds:
            shock = 0.03 * np.sin(7.0 * seed + 1.0)  # data-order effect, shared by variants
            out.append(write_run(root, "baseline", size, seed, base_level + shock))
            for i, ((variant, heads), eff) in enumerate(effects.items()):
                noise = 0.002 * np.cos(3.0 * seed + i)
                label = f"{variant}_h{heads}" if variant == "mhar" and heads != 4 else variant
                out.append(write_run(root, variant, size, seed, base_level + shock + eff + noise, heads,
                                     label=label))
    return out


def write_eval(eval_dir: Path, model_path: str, tasks: dict[str, np.ndarray | tuple], groups=None,
               metric: str = "acc", run: Optional[dict] = None, display: Optional[dict] = None) -> Path:
    """Eval dir: tasks maps name -> per-doc 0/1 array (stored as ``metric``), or (loglik, words) for a
    perplexity task; ``run`` and ``display``: the records eval.run copies from the model (None: a model that
    records no run, e.g. hf:<name>)."""
    for task, vals in tasks.items():
        d = eval_dir / task
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        n = len(vals[0]) if isinstance(vals, tuple) else len(vals)
        for i in range(n):
            if isinstance(vals, tuple):
                m = {"word_perplexity": [float(vals[0][i]), float(vals[1][i])],
                     "bits_per_byte": [float(vals[0][i]), float(vals[1][i]) * 5]}
            else:
                m = {metric: float(vals[i]), "acc_norm": float(vals[i])}
            rec = {"doc_id": i, "prompt_hash": f"h{task}{i}", "target": "x", "metrics": m}
            if groups is not None:
                rec["group"] = int(groups[i])
            lines.append(json.dumps(rec))
        (d / "samples.jsonl").write_text("\n".join(lines) + "\n")
        res = {"model": model_path, "n": n, "subset": "first:200", "run": run}
        if display is not None:
            res["display"] = display
        (d / "results.json").write_text(json.dumps(res))
    return eval_dir


def write_run_eval(run_dir: Path, tasks: dict, **kw) -> Path:
    """``run_dir/eval``: an evaluation of the run's model.pt, with the run block and display record that eval.run
    copies from it (write_eval's keywords)."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return write_eval(Path(run_dir) / "eval", str(Path(run_dir) / "model.pt"), tasks, run=summary["run"],
                      display=summary["display"], **kw)


def make_downstream(root: Path, n: int = 200, acc_gain: float = 0.15, seed: int = 0,
                    n_groups: Optional[int] = None, tokenizer: Optional[str] = None) -> tuple[list[Path], dict]:
    """Baseline and MHAR H=4 eval dirs (100M, seed 0) with a planted LAMBADA gain and lower perplexity
    (``tokenizer``: the runs' data.tokenizer, default the run config's byte level)."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, n) if n_groups else None
    u = rng.random(n)
    p = rng.uniform(0.1, 0.5, n)
    lam_b = (u < p).astype(float)
    lam_m = (u < p + acc_gain).astype(float)
    hs = (rng.random(n) < 0.3).astype(float)
    hs_m = np.where(rng.random(n) < 0.2, 1.0 - hs, hs)  # HellaSwag: discordant items both ways, no planted gain
    words = rng.integers(100, 600, n).astype(float)
    ll_b = rng.normal(-4.0, 0.2, n) * words
    ll_m = ll_b + rng.normal(0.1, 0.05, n) * words  # higher loglik -> lower perplexity
    dirs = []
    for variant, heads, lam, h, ll in (("baseline", None, lam_b, hs, ll_b), ("mhar", 4, lam_m, hs_m, ll_m)):
        run = write_run(root, variant, "100M", 0, 3.0, heads,
                        overrides=[f"data.tokenizer={tokenizer}"] if tokenizer else ()).parent
        dirs.append(write_run_eval(run, {"lambada_openai": lam, "hellaswag": h, "wikitext": (ll, words)},
                                   groups=groups))
    return dirs, {"lam_b": lam_b, "lam_m": lam_m, "hs_b": hs, "hs_m": hs_m, "ll_b": ll_b, "ll_m": ll_m,
                  "words": words, "groups": groups}


def make_cpt(root: Path, n: int = 1319, seed: int = 0) -> tuple[list[Path], dict]:
    """base / plain / mhar eval dirs on one GSM8K-like task with planted CPT (+0.28) and MHAR (+0.04) gains."""
    rng = np.random.default_rng(seed)
    p0 = rng.uniform(0.0, 0.4, n)
    u = rng.random(n)
    u2 = np.where(rng.random(n) < 0.3, rng.random(n), u)  # MHAR arm: mostly the same items as plain
    arms = {"base": (u < p0), "plain": (u < p0 + 0.28), "mhar": (u2 < p0 + 0.32)}
    dirs = []
    for name, v in arms.items():
        d = root / "cpt" / name
        write_eval(d, f"hf:/models/{name}", {"gsm8k": v.astype(float)}, metric="exact_match,strict-match")
        dirs.append(d)
    return dirs, {k: v.astype(float) for k, v in arms.items()}


def write_bench(path: Path, sizes=("tiny", "100M")) -> Path:
    rows = ["size,provider,tokens_per_s,peak_mem_gb,status"]
    for s in sizes:
        base = {"tiny": 5e4, "100M": 1e5}.get(s, 1e4)
        for prov, r, mem in (("baseline", 1.0, 40.0), ("mhar_compile", 0.5, 50.0), ("mhar_fused", 0.9, 41.0)):
            for rep in range(2):
                rows.append(f"{s},{prov},{base * r * (1 + 0.01 * rep):.1f},{mem},ok")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def write_bench_training(path: Path) -> Path:
    """Rows in the format of benchmarks/bench_training.py (variant, peak_mem_gib, thr_ratio, status, the routing
    the row ran)."""
    rows = ["size,variant,heads,B,T,tokens_per_s,peak_mem_gib,status,wall_s,thr_ratio,mem_ratio,gpu,routing_resolved",
            "1B,baseline,0,2,1024,20000.0,19.0,ok,30.0,,,H200,",
            "1B,mhar_eager,8,2,1024,,,OOM,12.0,,,H200,eager",
            "1B,mhar_compile,8,2,1024,5000.0,47.0,ok,80.0,0.25,2.47,H200,compile",
            "1B,mhar_fused,8,2,1024,9000.0,21.0,ok,40.0,0.45,1.1,H200,fused"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path
