"""Inference cost: scoring and decoding speed and peak memory, baseline and MHAR beside transformers' Qwen3.

What users get, measured side by side in one process per size (random bf16 weights: speed does not depend on
their values; eval mode, no_grad):

  * scoring (``score_tok_s``): the lm-eval adapter's path, ``mhar.model.inference.Scorer.sequence_logprobs`` (the
    per-sample log-likelihood of whole sequences: hidden states, output head on every position, log-softmax and
    gather; compiled on CUDA by default) on a (B, T) batch; ``forward_tok_s``: plain eager ``model(ids)`` (logits
    for every position). transformers: ``Qwen3ForCausalLM(ids).logits`` (SDPA; the forward only, without the
    log-softmax lm-eval's ``hf`` model adds), same shapes and configuration;
  * decoding (``decode_ms_per_token``): ``model.generate`` (the adapter's ``generate_until`` path: static KV cache,
    compiled decode steps replayed as CUDA graphs) of B prompts: (time of ``generate(1 + N)`` - time of
    ``generate(1)``) / N, one step for the whole batch; transformers: ``generate(do_sample=False)`` the same way
    (its default dynamic cache, eager); ``prefill_tok_s``: B x prompt / time of ``generate(1)``;
  * ``peak_mem_gib``: ``torch.cuda.max_memory_allocated`` over the timed scoring and decoding calls (weights
    included; ``score_peak_gib`` / ``decode_peak_gib`` each); ``score_first_s`` / ``decode_first_s``: the first
    call (compilation, autotuning, CUDA-graph capture: the cold start of an evaluation);
  * ``decode_floor_ms``: the bytes one decode step must read (bf16 weights + the KV cache) over the copy
    bandwidth measured in the same run (``hbm_gb_s``): the distance to the weight-bandwidth limit.

Ratios: ``score_vs_baseline`` (tok/s over the baseline's), ``decode_vs_baseline`` (ms over the baseline's, > 1 =
slower), on the baseline rows ``baseline_vs_hf_score`` (tok/s over transformers') and ``baseline_vs_hf_decode``
(transformers' ms over ours, > 1 = faster). Medians of ``--repeats`` timed calls after the first.

    PYTHONPATH=. python benchmarks/bench_inference.py --sizes 1B --out results/bench/inference.csv --append
    PYTHONPATH=. python benchmarks/bench_inference.py --sizes debug --device cpu --shapes 2:32:16 --new 3 \\
        --repeats 1 --out /tmp/inference.csv        # CPU smoke run
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Callable, Optional, Sequence

import torch

from benchmarks.common import add_out_args, env_columns, existing_rows, measure_hbm_bandwidth, write_csv
from mhar.model.config import ROUTING_IMPLS, model_config
from mhar.model.inference import decoder_for, generate, scorer_for
from mhar.model.transformer import build_model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> Optional[float]:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def default_mhar_impl(device: torch.device) -> str:
    """The routing of the paper configs' MHAR H=8 on CUDA (``auto`` where the library has it), eager on CPU."""
    if device.type != "cuda":
        return "eager"
    return "auto" if "auto" in ROUTING_IMPLS else "fused_v7_sg8"


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


def build_hf_model(size: str, device: torch.device, dtype: torch.dtype):
    """transformers' Qwen3ForCausalLM with our preset's shapes (tied embeddings, q/k norm, RoPE theta, eps), SDPA."""
    from transformers import Qwen3Config, Qwen3ForCausalLM  # lazy: transformers, only for the hf reference rows

    c = model_config(size)
    conf = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                       num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                       head_dim=c.resolved_head_dim, max_position_embeddings=max(4096, c.max_seq_len),
                       rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
                       attention_bias=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(conf, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def _measure(score: Callable, forward: Optional[Callable], gen: Callable[[int], object], batch: int, T: int,
             prompt: int, new: int, repeats: int, device: torch.device) -> dict:
    out: dict = {}
    out["score_first_s"] = round(_timed(score, device), 3)
    _peak_reset(device)
    t = statistics.median(_timed(score, device) for _ in range(repeats))
    out["score_s"], out["score_tok_s"], out["score_peak_gib"] = round(t, 5), round(batch * T / t, 1), _peak(device)
    if forward is not None:
        forward()
        out["forward_tok_s"] = round(batch * T / statistics.median(_timed(forward, device) for _ in range(repeats)), 1)
    t0 = time.perf_counter()
    gen(1), gen(1 + new)  # first calls: compilation, capture, allocator
    out["decode_first_s"] = round(time.perf_counter() - t0, 3)
    _peak_reset(device)
    t_short = statistics.median(_timed(lambda: gen(1), device) for _ in range(repeats))
    t_long = statistics.median(_timed(lambda: gen(1 + new), device) for _ in range(repeats))
    out.update(prefill_s=round(t_short, 5), prefill_tok_s=round(batch * prompt / t_short, 1),
               decode_ms_per_token=round(1e3 * max(t_long - t_short, 0.0) / new, 4), decode_peak_gib=_peak(device))
    peaks = [p for p in (out["score_peak_gib"], out["decode_peak_gib"]) if p is not None]
    out["peak_mem_gib"] = round(max(peaks), 4) if peaks else ""
    for k in ("score_peak_gib", "decode_peak_gib"):
        out[k] = round(out[k], 4) if out[k] is not None else ""
    return out


def bench_ours(size: str, variant: str, routing_impl: str, heads: int, batch: int, T: int, prompt: int, new: int,
               repeats: int, device: torch.device, dtype: torch.dtype, compile: str, cuda_graphs: str,
               decode_kernel: Optional[bool] = None) -> dict:
    model, contexts = build_inference_model(size, variant, routing_impl, heads, batch, prompt, device, dtype)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, T), generator=torch.Generator().manual_seed(1)).to(device)
    scorer = scorer_for(model, compile=compile, cuda_graphs=cuda_graphs)
    dec = decoder_for(model, compile=compile, cuda_graphs=cuda_graphs, kernel=decode_kernel)
    with torch.no_grad():
        row = _measure(lambda: scorer.sequence_logprobs(ids), lambda: model(ids).logits,
                       lambda k: generate(model, contexts, k), batch, T, prompt, new, repeats, device)
    row.update(params=model.num_params(), compile=scorer.mode(), decode_compile=dec.mode(),
               cuda_graphs=dec.graphs(), decode_kernel=bool(dec.router.kernel), score_captures=scorer.captures, kv_cache_gib=round(sum(t.numel() * t.element_size() for c in dec._caches.values()
                                                                for t in c.k + c.v) / 2**30, 4))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_step = 2 * model.cfg.n_layers * batch * model.cfg.n_kv_heads * (prompt + new) * model.cfg.resolved_head_dim \
        * torch.tensor([], dtype=dtype).element_size()
    row["step_bytes"] = weights + kv_step
    del model, scorer, dec
    return row


def bench_hf(size: str, batch: int, T: int, prompt: int, new: int, repeats: int, device: torch.device,
             dtype: torch.dtype) -> dict:
    model = build_hf_model(size, device, dtype)
    ids = torch.randint(0, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(1)).to(device)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    mask = torch.ones_like(prompts)

    def gen(k: int):
        return model.generate(prompts, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                              pad_token_id=0)

    with torch.no_grad():
        row = _measure(lambda: model(ids, use_cache=False).logits, None, gen, batch, T, prompt, new, repeats, device)
    row.update(params=sum(p.numel() for p in model.parameters()), compile="none", cuda_graphs=False)
    del model
    return row


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _shape(text: str) -> tuple[int, int, int]:
    try:
        b, t, p = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r} is not BATCH:SCORE_T:PROMPT (e.g. 8:1024:512)")
    return b, t, p


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/bench_inference.py", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--variants", nargs="+", default=["baseline", "mhar"], help="residual variants")
    ap.add_argument("--mhar-impl", default=None, help="routing_impl of the routed variants (default: the paper "
                    "configs' on CUDA, eager on CPU)")
    ap.add_argument("--heads", type=int, default=8, help="routing heads of mhar")
    ap.add_argument("--shapes", nargs="+", type=_shape, default=[(8, 1024, 512), (1, 2048, 2048)],
                    help="BATCH:SCORE_T:PROMPT per measured shape (scoring length, decoding prompt length)")
    ap.add_argument("--new", type=int, default=32, help="decoded tokens per row (after the first)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' Qwen3 (no baseline_vs_hf_* ratios)")
    ap.add_argument("--compile", default="auto", help="scoring / decoding compile mode: auto|regional|whole|none")
    ap.add_argument("--cuda-graphs", default="auto", help="scoring / decode steps as CUDA graphs: auto|true|false")
    ap.add_argument("--decode-kernel", default="auto", choices=["auto", "0", "1"],
                    help="routed decode reads by the Triton decode kernel (auto: on CUDA) or the PyTorch expression")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="default: bf16 on cuda, fp32 on cpu")
    add_out_args(ap, "results/bench/inference.csv")
    a = ap.parse_args(argv)
    keep = existing_rows(a.out, a.append)  # before any run: an existing record is never overwritten
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: CUDA is not available")
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    impl = a.mhar_impl or default_mhar_impl(device)
    env = env_columns(argv=list(argv) if argv is not None else None)
    hbm = None
    if device.type == "cuda":
        hbm = measure_hbm_bandwidth()
    rows = []
    for size in a.sizes:
        for batch, T, prompt in a.shapes:
            got = {}
            for variant in (["hf"] if not a.no_hf else []) + list(a.variants):
                t0 = time.perf_counter()
                if variant == "hf":
                    r = bench_hf(size, batch, T, prompt, a.new, a.repeats, device, dtype)
                else:
                    r = bench_ours(size, variant, impl, a.heads, batch, T, prompt, a.new, a.repeats, device, dtype,
                                   a.compile, a.cuda_graphs,
                                   None if a.decode_kernel == "auto" else a.decode_kernel == "1")
                _free(device)
                got[variant] = r
                r.update(size=size, variant=variant, routing_impl=impl if variant not in ("hf", "baseline") else "",
                         heads=a.heads if variant not in ("hf", "baseline") else "", dtype=str(dtype), batch=batch,
                         score_tokens=T, prompt_tokens=prompt, new_tokens=a.new, repeats=a.repeats,
                         wall_s=round(time.perf_counter() - t0, 1),
                         routing_autotune=os.environ.get("MHAR_ROUTING_AUTOTUNE", "1"))
                if hbm and "step_bytes" in r:
                    r["hbm_gb_s"] = round(hbm, 1)
                    r["decode_floor_ms"] = round(1e3 * r["step_bytes"] / (hbm * 1e9), 4)
                print(f"{size} B={batch} {variant}: score {r['score_tok_s']:.0f} tok/s, decode "
                      f"{r['decode_ms_per_token']:.2f} ms/token, peak {r['peak_mem_gib']} GiB, first calls "
                      f"{r['score_first_s']} + {r['decode_first_s']} s", flush=True)
            base, hf = got.get("baseline"), got.get("hf")
            for variant, r in got.items():
                if base and variant not in ("baseline", "hf"):
                    r["score_vs_baseline"] = round(r["score_tok_s"] / base["score_tok_s"], 4)
                    r["decode_vs_baseline"] = (round(r["decode_ms_per_token"] / base["decode_ms_per_token"], 4)
                                               if base["decode_ms_per_token"] else "")
                if variant == "baseline" and hf:
                    r["baseline_vs_hf_score"] = round(r["score_tok_s"] / hf["score_tok_s"], 4)
                    r["baseline_vs_hf_decode"] = (round(hf["decode_ms_per_token"] / r["decode_ms_per_token"], 4)
                                                  if r["decode_ms_per_token"] else "")
                    r["baseline_vs_hf_peak"] = (round(r["peak_mem_gib"] / hf["peak_mem_gib"], 4)
                                                if r["peak_mem_gib"] and hf["peak_mem_gib"] else "")
                rows.append({**r, **env})
    write_csv(a.out, rows, keep)
    cols = ("size", "batch", "variant", "score_tok_s", "score_vs_baseline", "forward_tok_s", "decode_ms_per_token",
            "decode_vs_baseline", "baseline_vs_hf_score", "baseline_vs_hf_decode", "peak_mem_gib", "decode_floor_ms",
            "score_first_s", "decode_first_s")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
