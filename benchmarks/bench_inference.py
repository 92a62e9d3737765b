"""Inference cost: prefill throughput, per-token decode latency and peak memory, baseline vs MHAR.

Every number comes from the library's own generation path, ``Transformer.generate`` (the one
``eval.adapter.MharLM.generate_until`` uses: KV-cache prefill of the right-padded prompts, then
one token per step through the cache; routed variants build their depth sources for the new
positions only). Per (size, variant), with random bf16 weights (speed does not depend on their
values) and a batch of random prompts:

  * ``prefill_tok_s``: batch x prompt tokens / wall time of ``generate(max_new_tokens=1)``
    (prefill + the first token);
  * ``decode_ms_per_token``: (time of ``generate(max_new_tokens=1 + N)`` - prefill time) / N,
    one step for the whole batch (no row stops early: no stop tokens);
  * ``peak_mem_gib``: ``torch.cuda.max_memory_allocated`` during the longer call (CUDA only).

Medians over ``--repeats`` timed calls after warm-up calls (Triton compilation and autotuning, allocator).
``MHAR_ROUTING_AUTOTUNE=0`` skips the fused kernels' autotuning (one fixed launch configuration; recorded
in the ``routing_autotune`` column) when a cold Triton cache would make the run too long.

    PYTHONPATH=. python benchmarks/bench_inference.py --sizes 100M 350M 1B --out results/bench/inference.csv --append
    PYTHONPATH=. python benchmarks/bench_inference.py --sizes debug --device cpu --mhar-impl eager \\
        --batch 2 --prompt 32 --new 4 --repeats 1 --out /tmp/inference.csv        # CPU smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Optional, Sequence

import torch

from benchmarks.common import add_out_args, env_columns, existing_rows, write_csv
from mhar.config import model_config
from mhar.model import build_model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def build_inference_model(size: str, variant: str, routing_impl: str, heads: int, batch: int, prompt: int,
                          device: torch.device, dtype: torch.dtype, seed: int = 0):
    """The benchmarked model (random weights, ``dtype``, eval mode) and ``batch`` random prompts of ``prompt``
    tokens (shared with ``benchmarks/profile_step.py generate``)."""
    residual = {"variant": variant} if variant == "baseline" else {"variant": variant, "heads": heads,
                                                                   "routing_impl": routing_impl}
    cfg = model_config(size, residual=residual)
    torch.manual_seed(seed)
    with torch.device(device):
        model = build_model(cfg)
    model = model.to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    return model, torch.randint(0, cfg.vocab_size, (batch, prompt), generator=g).tolist()


def bench_one(size: str, variant: str, routing_impl: str, heads: int, batch: int, prompt: int, new: int,
              repeats: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict:
    model, contexts = build_inference_model(size, variant, routing_impl, heads, batch, prompt, device, dtype, seed)
    short = lambda: model.generate(contexts, 1)  # noqa: E731  prefill + first token
    long = lambda: model.generate(contexts, 1 + new)  # noqa: E731
    short(), model.generate(contexts, 2)  # warm-up of the prefill and step shapes: kernels, autotuning, allocator
    t_short = statistics.median(_timed(short, device) for _ in range(repeats))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_long = statistics.median(_timed(long, device) for _ in range(repeats))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    out = {"size": size, "variant": variant, "routing_impl": routing_impl if variant != "baseline" else "",
           "heads": heads if variant != "baseline" else "", "params": model.num_params(), "dtype": str(dtype),
           "batch": batch, "prompt_tokens": prompt, "new_tokens": new, "repeats": repeats,
           "prefill_s": round(t_short, 5), "prefill_tok_s": round(batch * prompt / t_short, 1),
           "decode_ms_per_token": round(1e3 * max(t_long - t_short, 0.0) / new, 4),
           "peak_mem_gib": round(peak, 4) if peak is not None else "",
           "routing_autotune": os.environ.get("MHAR_ROUTING_AUTOTUNE", "1")}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/bench_inference.py", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--variants", nargs="+", default=["baseline", "mhar"], help="residual variants")
    ap.add_argument("--mhar-impl", default="fused", help="routing_impl of the routed variants (fused on GPU)")
    ap.add_argument("--heads", type=int, default=8, help="routing heads of mhar")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per row")
    ap.add_argument("--new", type=int, default=32, help="decoded tokens per row (after the first)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="default: bf16 on cuda, fp32 on cpu")
    add_out_args(ap, "results/bench/inference.csv")
    a = ap.parse_args(argv)
    keep = existing_rows(a.out, a.append)  # before any run: an existing record is never overwritten
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: CUDA is not available")
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    env = env_columns(argv=list(argv) if argv is not None else None)
    rows = []
    for size in a.sizes:
        for variant in a.variants:
            row = bench_one(size, variant, a.mhar_impl, a.heads, a.batch, a.prompt, a.new, a.repeats, device, dtype)
            base = next((r for r in rows if r["size"] == size and r["variant"] == "baseline"), None)
            row["prefill_vs_baseline"] = round(row["prefill_tok_s"] / base["prefill_tok_s"], 4) if base else ""
            row["decode_vs_baseline"] = (round(row["decode_ms_per_token"] / base["decode_ms_per_token"], 4)
                                         if base and base["decode_ms_per_token"] else "")
            print({k: row[k] for k in ("size", "variant", "prefill_tok_s", "decode_ms_per_token", "peak_mem_gib")},
                  flush=True)
            rows.append({**row, **env})
    write_csv(a.out, rows, keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
