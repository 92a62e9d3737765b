"""GPU training smoke test: throughput and peak memory of baseline vs MHAR (eager routing).

Paper 100M shapes (vocab 151936, seq 2048, microbatch 8, bf16) on a synthetic Zipf token stream
(``data.corpus: synthetic:<n>``: no files, no hub), through the real trainer (``mhar.train``).

    python benchmarks/gpu_train_smoke.py --out $OUT [--steps 200] [--variants baseline,mhar]

Per variant it trains ``config/train/gpu_smoke.yaml`` into a scratch run directory (the exported
model and checkpoint stay out of ``--out``), then writes ``--out/gpu_train_smoke.json`` with
steady-state tokens/s (median over steps after warm-up, eval steps excluded), peak GPU memory,
throughput relative to the baseline, final losses and the synthetic stream's unigram entropy
(a model that learnt the unigram distribution reaches it), plus provenance; and copies each run's
summary/metrics/provenance to ``--out/runs/<variant>/``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name -> model.residual overrides
    "baseline": ["model.residual.variant=baseline"],
    "mhar": ["model.residual.variant=mhar", "model.residual.heads=8", "model.residual.routing_impl=eager"],
    "attnres": ["model.residual.variant=attnres", "model.residual.routing_impl=eager"],
}


def steady_tokens_per_s(metrics: Path, warmup: int) -> float:
    """Median tokens/s over train steps after ``warmup``, skipping steps that follow an evaluation."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    rates, prev, after_eval = [], None, False
    for r in rows:
        if r["split"] == "val":
            after_eval = True
            continue
        if prev is not None and r["step"] > warmup and not after_eval:
            rates.append((r["tokens"] - prev["tokens"]) / max(r["wall_s"] - prev["wall_s"], 1e-9))
        prev, after_eval = r, False
    return statistics.median(rates) if rates else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--variants", default="baseline,mhar")
    p.add_argument("--config", default=str(ROOT / "config" / "train" / "gpu_smoke.yaml"))
    p.add_argument("--scratch", default=None, help="where run directories go (default: a temp dir)")
    p.add_argument("--allow-cpu", action="store_true", help="dry run without a GPU (use with small overrides)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every variant")
    args = p.parse_args()

    import numpy as np
    import torch

    from mhar.data import SyntheticCorpus, resolve_corpus
    from mhar.provenance import collect_provenance
    from mhar.runconfig import load_run_config
    from mhar.train import train

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("error: no CUDA device visible; this smoke test is for a GPU machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="mhar_gpu_smoke_"))
    results: dict = {"steps": args.steps, "config": args.config, "variants": {}}
    for name in args.variants.split(","):
        if name not in VARIANTS:
            print(f"error: unknown variant {name!r}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        cfg = load_run_config(args.config, [f"train.steps={args.steps}", *VARIANTS[name], *args.overrides])
        run = scratch / name
        if run.exists():
            shutil.rmtree(run)
        torch.cuda.empty_cache()
        try:
            summary = train(cfg, run)
            status = "ok"
        except torch.cuda.OutOfMemoryError as e:
            summary, status = None, f"OOM: {str(e).splitlines()[0]}"
        dest = out / "runs" / name
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("summary.json", "metrics.jsonl", "provenance.json", "config.yaml"):
            if (run / f).is_file():
                shutil.copy(run / f, dest / f)
        entry = {"status": status}
        if summary is not None:
            train_rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            entry.update(
                tokens_per_s=steady_tokens_per_s(run / "metrics.jsonl", warmup=min(10, args.steps // 4)),
                tokens_per_s_overall=summary["tokens_per_s"], peak_mem_gb=summary["peak_mem_gb"],
                params=summary["params"], final_train_loss=[r for r in train_rows if r["split"] == "train"][-1]["loss"],
                final_val_loss=summary["final_val_loss"], tokens=summary["tokens"], wall_s=summary["wall_s"],
                micro_batch=cfg.train.micro_batch, seq_len=cfg.data.seq_len, vocab=cfg.model.vocab_size,
            )
        results["variants"][name] = entry
        print(f"[gpu_train_smoke] {name}: {json.dumps(entry)}", flush=True)
        shutil.rmtree(run, ignore_errors=True)  # model.pt + checkpoint are ~1.5 GB at 100M

    base = results["variants"].get("baseline", {}).get("tokens_per_s")
    for name, e in results["variants"].items():
        if base and e.get("tokens_per_s"):
            e["throughput_vs_baseline"] = e["tokens_per_s"] / base
    corpus = resolve_corpus(cfg.data.corpus, None, vocab_size=cfg.model.vocab_size)
    if isinstance(corpus, SyntheticCorpus):
        pr = corpus.probabilities()
        results["synthetic_unigram_entropy_nats"] = float(-(pr * np.log(pr)).sum())
    results["reference_paper_h100_100M"] = {"baseline_tokens_per_s": 113900, "eager_rel_throughput": 0.31,
                                            "baseline_peak_gb": 41.5, "eager_peak_gb": 68.8}
    results["provenance"] = collect_provenance()
    (out / "gpu_train_smoke.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n[gpu_train_smoke] variant      tokens/s   peak GB   rel. throughput   final val loss")
    for name, e in results["variants"].items():
        if e["status"] != "ok":
            print(f"[gpu_train_smoke] {name:<10} {e['status']}")
            continue
        print(f"[gpu_train_smoke] {name:<10} {e['tokens_per_s']:>10,.0f} {e['peak_mem_gb']:>9.1f} "
              f"{e.get('throughput_vs_baseline', float('nan')):>17.2f} {e['final_val_loss']:>16.3f}")
    print(f"[gpu_train_smoke] wrote {out / 'gpu_train_smoke.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
