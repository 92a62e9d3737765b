"""Training throughput and peak memory: baseline vs MHAR (compile / fused routing).

One optimizer step = forward + backward + grad clipping + fused AdamW on one
microbatch of the paper (8x2048 at 100M, 4x1024 at 350M, 2x1024 at 1B), bf16
autocast with fp32 master weights, the model under torch.compile (decoder and
LM head + loss as two compiled functions, see run_one; ``baseline_whole`` compiles
the whole module for comparison), SDPA
restricted to the flash kernel. Each (size, variant) runs in its own process
(fresh allocator statistics, no shared compile state). Throughput is tokens/s over
``--steps`` timed steps after ``--warmup`` steps; peak memory is
torch.cuda.max_memory_allocated over the timed steps. Ratios are against the
baseline of the same size.

    PYTHONPATH=. python benchmarks/bench_training.py --sizes 100M 350M 1B \
        --variants baseline mhar_compile mhar_fused --heads 8 --out results/bench/training.csv
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import env_columns, write_csv

MICROBATCH = {"100M": (8, 2048), "350M": (4, 1024), "1B": (2, 1024), "debug": (2, 64), "tiny": (2, 128)}
VARIANTS = {
    "baseline": {"variant": "baseline"},
    "baseline_whole": {"variant": "baseline"},  # torch.compile(model) instead of the two compiled parts
    "mhar_eager": {"variant": "mhar", "routing_impl": "eager"},
    "mhar_compile": {"variant": "mhar", "routing_impl": "compile"},
    "mhar_fused": {"variant": "mhar", "routing_impl": "fused"},
    # fused routing, each block's two sublayer methods compiled (2 graphs shared by all layers) + head/loss:
    # no per-layer recompiles of the decoder loop (see run_one)
    "mhar_fused_sub": {"variant": "mhar", "routing_impl": "fused"},
    # the same with prefix sharing (MHAR_ROUTING_GROUP=auto: groups of about sqrt(reads) share one pass over
    # their common prefix, forward and backward); _fwdshare: groups share the forward pass only
    "mhar_fused_sub_auto": {"variant": "mhar", "routing_impl": "fused"},
    "mhar_fused_sub_fwdshare": {"variant": "mhar", "routing_impl": "fused"},
    "mhar_fused_sub_g1": {"variant": "mhar", "routing_impl": "fused"},  # = the default since v4 (group 1)
    # torch.compile'd routing op (one graph per number of sources) between the compiled sublayers
    "mhar_compile_sub": {"variant": "mhar", "routing_impl": "compile"},
}
ENV = {"mhar_fused_sub_g1": {"MHAR_ROUTING_GROUP": "1"}, "mhar_fused_sub_auto": {"MHAR_ROUTING_GROUP": "auto"},
       "mhar_fused_sub_fwdshare": {"MHAR_ROUTING_GROUP": "auto", "MHAR_ROUTING_SHARED_BWD": "0"}}


def _head_loss(model, h, labels):
    """Transformer.forward's tail: LM head and mean next-token cross-entropy in fp32."""
    logits = model.lm_head(h)  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def run_one(size: str, variant: str, heads: int, steps: int, warmup: int, device: str, backend: str,
            graph: bool = False) -> dict:
    """Time one configuration in this process; returns a result row (no provenance)."""
    from mhar.config import model_config
    from mhar.model import build_model

    torch.manual_seed(0)
    res = dict(VARIANTS[variant])
    if res["variant"] != "baseline":
        res["heads"] = heads
    cfg = model_config(size, residual=res)
    B, T = MICROBATCH[size]
    group = ""
    if res.get("routing_impl") == "fused":  # reads per prefix-sharing group (1: none)
        from mhar.routing.fused import FusedRouter
        group = FusedRouter().group_size(cfg.n_sublayers + 1)  # reads per forward: every sublayer + final
    # The decoder loop passes the sublayer index as an int: with graph breaks around routing calls each
    # sublayer is its own compiled frame (one per index), so lift dynamo's recompile limits.
    for name, val in (("cache_size_limit", 1024), ("recompile_limit", 1024), ("accumulated_cache_size_limit", 8192),
                      ("accumulated_recompile_limit", 8192)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, val)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cuda.enable_math_sdp(False)  # flash SDPA only: an error, not a silent fallback
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_flash_sdp(True)
    model = build_model(cfg).to(device)
    graph = graph and device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=device == "cuda", capturable=graph)
    compile_ = (lambda f: torch.compile(f, backend=backend)) if backend != "none" else (lambda f: f)
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    if variant == "baseline_whole":
        cmodel = compile_(model)
        forward = lambda: cmodel(ids, labels=ids).loss  # noqa: E731
    elif "_sub" in variant:
        for blk in model.layers:  # one compiled graph per sublayer kind, shared by all layers
            blk.attn_sublayer = compile_(blk.attn_sublayer)
            blk.mlp_sublayer = compile_(blk.mlp_sublayer)
        head = compile_(lambda h, labels: _head_loss(model, h, labels))
        forward = lambda: head(model.hidden(ids), ids)  # noqa: E731
    else:
        # Two compiled parts with exactly Transformer.forward's math: the decoder (model.hidden) and the
        # LM head + loss. A routing_impl='fused' model graph-breaks around each routing call, and dynamo
        # would leave the code after such a break inside forward's try/finally uncompiled (fp32 logits
        # in eager: +14 GiB at 100M); compiling the head + loss on its own keeps it fused for every variant.
        hidden = compile_(model.hidden)
        head = compile_(lambda h, labels: _head_loss(model, h, labels))
        forward = lambda: head(hidden(ids), ids)  # noqa: E731

    def body() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        return loss.detach()

    def step() -> torch.Tensor:
        loss = body()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    if graph:
        # Whole-step CUDA graph (PyTorch's whole-network capture recipe): warm up (compile, autotune) on a side
        # stream, then capture forward + backward + clipping + capturable fused AdamW once; a step is a replay.
        # Grads are allocated inside the capture (set to None before it) and overwritten by every replay.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                loss = step()
        torch.cuda.current_stream().wait_stream(side)
        sync()
        torch.cuda.reset_peak_memory_stats()  # the capture allocates exactly what one step does
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            static_loss = body()
        cuda_graph.replay()
        run = lambda: (cuda_graph.replay(), static_loss)[1]  # noqa: E731
    else:
        for _ in range(warmup):
            loss = step()
        run = step
    sync()
    warm_s = time.perf_counter() - t0
    if device == "cuda" and not graph:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = run()
    sync()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return dict(size=size, variant=variant, heads=heads if res["variant"] != "baseline" else 0, B=B, T=T,
                params=model.num_params(), steps=steps, step_ms=round(1e3 * dt / steps, 2),
                tokens_per_s=round(steps * B * T / dt, 1), peak_mem_gib=round(peak, 3),
                warmup_s=round(warm_s, 1), final_loss=round(float(loss), 4), status="ok",
                routing_group=group, cuda_graph=int(graph))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--variants", nargs="+", default=["baseline", "mhar_compile", "mhar_fused"],
                    choices=list(VARIANTS))
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per (size, variant) process")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend, or 'none'")
    ap.add_argument("--graph", type=int, choices=(0, 1), default=1,
                    help="1: time whole-step CUDA graph replays (every variant, baseline included); 0: eager steps")
    ap.add_argument("--out", default="results/bench/training.csv")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        row = run_one(args.one[0], args.one[1], args.heads, args.steps, args.warmup, args.device, args.backend,
                      graph=bool(args.graph))
        print("RESULT " + json.dumps(row), flush=True)
        return
    env = env_columns("benchmarks.bench_training", argv)
    rows = []
    for size in args.sizes:
        for variant in args.variants:
            cmd = [sys.executable, "-m", "benchmarks.bench_training", "--one", size, variant,
                   "--heads", str(args.heads), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--device", args.device, "--backend", args.backend, "--graph", str(args.graph)]
            t0 = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                   env={**os.environ, **ENV.get(variant, {})})
                lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                if lines:
                    row = json.loads(lines[-1][7:])
                else:
                    err = (p.stderr.strip().splitlines() or ["no output"])[-1]
                    row = dict(size=size, variant=variant, status="OOM" if "OutOfMemory" in p.stderr
                               else f"error: {err[:200]}")
                    print(p.stderr[-3000:], file=sys.stderr)
            except subprocess.TimeoutExpired:
                row = dict(size=size, variant=variant, status=f"timeout after {args.timeout:.0f}s")
            row["wall_s"] = round(time.time() - t0, 1)
            base = next((r for r in rows if r["size"] == size and r["variant"] == "baseline"
                         and r.get("status") == "ok"), None)
            if base and row.get("status") == "ok":
                row["thr_ratio"] = round(row["tokens_per_s"] / base["tokens_per_s"], 4)
                row["mem_ratio"] = round(row["peak_mem_gib"] / base["peak_mem_gib"], 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
            keys = ["size", "variant", "heads", "B", "T", "params", "steps", "step_ms", "tokens_per_s",
                    "peak_mem_gib", "thr_ratio", "mem_ratio", "routing_group", "cuda_graph", "warmup_s", "final_loss", "status", "wall_s"]
            write_csv(args.out, [{**{k: r.get(k) for k in keys}, **env} for r in rows])


if __name__ == "__main__":
    main()
