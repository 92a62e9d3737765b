"""Where the time of a routed step goes (the one profiler): CUDA kernel time vs wall time, top kernels
(torch.profiler), or one routing microbatch under Nsight Compute.

    PYTHONPATH=. python -m benchmarks.profile_step op 350M fused          # every routing call of one microbatch
    PYTHONPATH=. python -m benchmarks.profile_step op 350M fused_nopdl    # (impls: bench_routing_op.IMPLS)
    PYTHONPATH=. python -m benchmarks.profile_step train 100M mhar_fused  # (variants: bench_training.VARIANTS)
    PYTHONPATH=. python -m benchmarks.profile_step generate 350M mhar     # inference.generate as bench_inference
                                                                          # times it (8 x 512 prompt + 8 tokens)
    PYTHONPATH=. python -m benchmarks.profile_step forward 1B baseline hf # eager model(ids) (B x T = 1 x 2048,
                                                                         # --shape B:T) beside transformers' Qwen3
    PYTHONPATH=. python -m benchmarks.profile_step train 1B baseline mhar_fused --json $OUT/prof.json
                                     # several in one process: kernel time by category side by side, with the
                                     # difference to the first (where MHAR's extra step time goes)
    ncu --clock-control none --profile-from-start off -k regex:_src_bwd --launch-skip 60 --launch-count 1 \
        --section SpeedOfLight --section Occupancy python3 -m benchmarks.profile_step ncu 1B fused
                                     # hardware counters: one tuned microbatch between cudaProfilerStart / Stop

Prints, per iteration: wall ms (synchronised), summed CUDA kernel ms, kernel count, and the kernels with
the most CUDA time. Wall >> kernel time means the GPU waits for the CPU (launch / Python overhead). With
several targets, also the CUDA time per kernel category (``kernel_category``). ``--json`` writes every
kernel's ms / calls per iteration for each target (``benchmarks/traffic_bound.py --profile`` sets each routing
kernel beside its bytes).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_inference import build_hf_model, build_inference_model, default_mhar_impl
from benchmarks.bench_training import build_step
from benchmarks.common import apply_settings, kernel_settings, microbatch, tuned_lines
from mhar.model.inference import generate
from mhar.model.presets import PRESETS
from mhar.model.routing import get_router


def _op_fn(size: str, impl: str):
    """Every routing call of one microbatch, forward and backward (as ``bench_routing_op`` times it; ``impl`` one
    of its ``IMPLS``, its kernel settings set for this process)."""
    # lazy: triton (bench_routing_op), only for the op target
    from benchmarks.bench_routing_op import IMPLS, Case, _inputs, _microbatch
    if impl not in IMPLS:
        raise SystemExit(f"error: op target {impl!r}: use one of {', '.join(IMPLS)}")
    name, settings = kernel_settings(impl)
    env = apply_settings(os.environ, settings)
    os.environ.clear()
    os.environ.update(env)
    p = PRESETS[size].model
    B, T = microbatch(size)
    c = Case(size, B, T, p["d_model"], 8, 2 * p["n_layers"] + 1)
    router = get_router(name)
    srcs, qs, gs = _inputs(c)
    douts = [torch.randn(B, T, c.D, device="cuda", dtype=torch.bfloat16) for _ in range(c.N)]

    def fn():
        outs = _microbatch(router, srcs, qs, gs, c.H)
        torch.autograd.backward(outs, douts)
        for t in srcs + qs + gs:
            t.grad = None
    return fn


def _train_fn(size: str, variant: str):
    """One optimizer step of the library's training step (benchmarks.bench_training.build_step: compiled
    pieces and fused AdamW, no CUDA graph so the profiler sees the kernels)."""
    step, batches, _ = build_step(size, variant, 8, "cuda", compile=True, graph=False)
    return lambda: step(batches[0], 5e-4)


def _generate_fn(size: str, variant: str, new: int = 8):
    """One ``mhar.model.inference.generate`` call of the inference benchmark's shapes (bf16, fused routing for routed
    variants): the prefill of 8 x 512 random tokens and ``new`` decode steps. The top CPU operators are printed
    too (wall >> kernel time: the GPU waits for Python)."""
    model, contexts = build_inference_model(size, variant, "fused", 8, 8, 512, torch.device("cuda"), torch.bfloat16)
    return lambda: generate(model, contexts, 1 + new)


_FORWARD_SHAPE = (1, 2048)


def _forward_fn(size: str, what: str):
    """Eager ``model(ids).logits`` under no_grad of our model (``baseline`` / ``mhar``: H=8, the paper configs'
    routing) or transformers' Qwen3ForCausalLM (``hf``), bf16, at ``_FORWARD_SHAPE``."""
    B, T = _FORWARD_SHAPE
    dev = torch.device("cuda")
    if what == "hf":
        model = build_hf_model(size, dev, torch.bfloat16)
        kw = {"use_cache": False}
    else:
        model, _ = build_inference_model(size, what, default_mhar_impl(dev), 8, 1, 1, dev, torch.bfloat16)
        kw = {}
    ids = torch.randint(0, 1000, (B, T), device=dev)

    def fn():
        with torch.no_grad():
            return model(ids, **kw).logits
    return fn


# kernel categories, first match wins (substrings of the lower-cased CUDA kernel name)
_CATEGORIES = (
    ("optimizer", ("multi_tensor", "fused_adam", "adamw", "foreach")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "splitk")),
    ("inductor fused", ("triton_",)),
    ("copy / fill", ("copy", "memcpy", "memset", "fill", "catarray", "cat_")),
    ("aten elementwise / reduce", ("elementwise", "reduce_kernel", "vectorized")),
)


def _routing_kernel_names() -> tuple[str, ...]:
    """Names of the fused router's Triton kernels (every ``*_kernel`` of mhar.model.routing._kernels)."""
    from mhar.model.routing import _kernels  # lazy: the Triton kernels (triton), only on a GPU
    return tuple(sorted(n for n in dir(_kernels) if n.endswith("_kernel") and n.startswith("_")))


def kernel_category(name: str, routing: tuple[str, ...] = ()) -> str:
    """The category of one CUDA kernel: "routing: <kernel>" for the fused router's kernels (``routing``),
    else the first of ``_CATEGORIES`` whose substrings the name contains, else "other"."""
    base = name.split("(")[0].strip()
    if base in routing:
        return f"routing: {base}"
    low = name.lower()
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def by_category(per_kernel: dict, routing: tuple[str, ...]) -> dict:
    """{category: ms per iteration} from {kernel name: [ms per iteration, calls per iteration]}."""
    out: dict = defaultdict(float)
    for name, (ms, _) in per_kernel.items():
        out[kernel_category(name, routing)] += ms
    return dict(out)


def category_table(results: dict, routing: tuple[str, ...]) -> str:
    """Side-by-side text table: CUDA ms per iteration per category for each target, and each later target's
    difference to the first (rows sorted by the largest difference)."""
    names = list(results)
    cats = {n: by_category(results[n]["kernels"], routing) for n in names}
    keys = sorted({c for d in cats.values() for c in d},
                  key=lambda c: -max(abs(cats[n].get(c, 0.0) - cats[names[0]].get(c, 0.0)) for n in names))
    head = f"  {'category':28s}" + "".join(f"{n[:22]:>24s}" for n in names) + \
        "".join(f"{'d ' + n[:20]:>24s}" for n in names[1:])
    lines = [head]
    for c in keys + ["all kernels", "wall"]:
        if c == "all kernels":
            vals = [sum(cats[n].values()) for n in names]
        elif c == "wall":
            vals = [results[n]["wall_ms"] for n in names]
        else:
            vals = [cats[n].get(c, 0.0) for n in names]
        lines.append(f"  {c:28s}" + "".join(f"{v:24.3f}" for v in vals) +
                     "".join(f"{v - vals[0]:+24.3f}" for v in vals[1:]))
    return "\n".join(lines)


def launch_sites(events, pattern: str, iters: int = 1, depth: int = 8) -> list[tuple[float, str, str, str]]:
    """Where the kernels whose name matches ``pattern`` (a regex) are launched from: one row per (operator,
    input shapes, Python stack) of the CPU events whose launched kernels match, as (launches per iteration,
    operator, shapes, stack: the innermost ``depth`` Python frames, innermost first; empty for operators the
    autograd engine runs from C++, e.g. a backward's fills), most launches first.
    ``events``: ``prof.events()`` of a profile taken with ``with_stack=True, record_shapes=True``."""
    rx = re.compile(pattern)
    sites = defaultdict(int)
    for e in events:
        n = sum(1 for k in getattr(e, "kernels", None) or [] if rx.search(k.name))
        if n:
            stack = " <- ".join((getattr(e, "stack", None) or [])[:depth])
            sites[(e.name, str(getattr(e, "input_shapes", "")), stack)] += n
    return sorted(((n / iters, op, sh, st) for (op, sh, st), n in sites.items()), key=lambda r: -r[0])


def _profile(kind: str, size: str, what: str, iters: int = 3, stack: str | None = None) -> dict:
    fn = {"op": _op_fn, "train": _train_fn, "generate": _generate_fn, "forward": _forward_fn}[kind](size, what)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack is not None,
                 record_shapes=stack is not None) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall_noprof = (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total / 1e3 / iters
            per[e.name][1] += 1
    for v in per.values():
        v[1] /= iters
    total = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values())
    print(f"PROFILE {kind} {size} {what}: wall {wall_noprof:.2f} ms/iter (profiled {wall:.2f}), "
          f"CUDA kernels {total:.2f} ms/iter, {n:.0f} kernels/iter, peak {peak:.2f} GiB allocated")
    for name, (ms, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {ms:8.3f} ms  x{cnt:5.0f}  {name[:110]}")
    if kind in ("generate", "forward"):  # where the host time goes
        print("  top CPU operators (self time):")
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]:
            print(f"  {e.self_cpu_time_total / 1e3 / iters:8.3f} ms  x{e.count / iters:6.0f}  {e.key[:100]}")
    out = {"wall_ms": wall_noprof, "wall_profiled_ms": wall, "peak_gib": peak, "kernels": {k: list(v) for k, v in per.items()}}
    if stack is not None:  # who launches the kernels matching --stack
        rows = launch_sites(prof.events(), stack, iters)
        print(f"  launch sites of kernels matching {stack!r} (per iteration):")
        for n, op, sh, st in rows[:20]:
            print(f"  x{n:5.1f}  {op}  {sh[:120]}\n           {st}")
        out["launch_sites"] = [list(r) for r in rows]
    return out


def _ncu(size: str, impl: str) -> None:
    """One microbatch of the routing op (``_op_fn``) between cudaProfilerStart / Stop, after two to autotune: run
    under ``ncu --profile-from-start off``, Nsight Compute sees only the kernels of one tuned microbatch."""
    fn = _op_fn(size, impl)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"NCU {size} {impl}: one microbatch profiled")
    print("\n".join(tuned_lines()))  # the launch configuration the autotuner chose per kernel / shape


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["op", "train", "generate", "forward", "ncu"])
    ap.add_argument("--shape", default="1:2048", help="forward: BATCH:T")
    ap.add_argument("size")
    ap.add_argument("targets", nargs="+", help="router impls (op) or bench_training variants (train, generate), "
                    "baseline / mhar / hf (forward)")
    ap.add_argument("--json", help="write every kernel's ms / calls per iteration for each target here")
    ap.add_argument("--stack", metavar="REGEX", help="also print the operator, input shapes and Python stack that "
                    "launch each kernel whose name matches REGEX (profiles with stacks and shapes: slower)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: profile_step profiles CUDA kernels; run it on a GPU machine")
    if args.kind == "ncu":
        for what in args.targets:
            _ncu(args.size, what)
        return
    global _FORWARD_SHAPE
    _FORWARD_SHAPE = tuple(int(x) for x in args.shape.split(":"))
    results = {}
    for what in args.targets:
        results[what] = _profile(args.kind, args.size, what, stack=args.stack)
        torch.cuda.empty_cache()
    routing = _routing_kernel_names()
    if len(results) > 1:
        print(f"CATEGORIES {args.kind} {args.size} (CUDA ms per iteration; d = minus {args.targets[0]})")
        print(category_table(results, routing))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": args.kind, "size": args.size, "command": " ".join(sys.argv),
                       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results,
                       "categories": {n: by_category(r["kernels"], routing) for n, r in results.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
