"""Where the time of a routed step goes: CUDA kernel time vs wall time, top kernels (torch.profiler).

    PYTHONPATH=. python benchmarks/profile_step.py op 350M fused        # every routing call of one microbatch
    PYTHONPATH=. python benchmarks/profile_step.py op 350M fused_v5     # (impl names: bench_routing_op._router)
    PYTHONPATH=. python benchmarks/profile_step.py train 100M mhar_fused    # (variants: bench_training.VARIANTS)
    PYTHONPATH=. python benchmarks/profile_step.py generate 350M mhar       # Transformer.generate as bench_inference
                                                                            # times it (8 x 512 prompt + 8 tokens)

Prints, per iteration: wall ms (synchronised), summed CUDA kernel ms, kernel count, and the kernels with
the most CUDA time. Wall >> kernel time means the GPU waits for the CPU (launch / Python overhead).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile


def _op_fn(size: str, impl: str):
    from benchmarks.bench_routing_op import MICROBATCH, Case, _inputs, _microbatch, _router
    from mhar.config import PRESETS
    p = PRESETS[size]
    B, T = MICROBATCH[size]
    c = Case(size, B, T, p["d_model"], 8, 2 * p["n_layers"] + 1)
    router = _router(impl)
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
    from benchmarks.bench_training import build_step

    step, batches, _ = build_step(size, variant, 8, "cuda", compile=True, graph=False)
    return lambda: step(batches[0], 5e-4)


def _generate_fn(size: str, variant: str, new: int = 8):
    """One ``Transformer.generate`` call of the inference benchmark's shapes (bf16, fused routing for routed
    variants): the prefill of 8 x 512 random tokens and ``new`` decode steps. The top CPU operators are printed
    too (wall >> kernel time: the GPU waits for Python)."""
    from benchmarks.bench_inference import build_inference_model

    model, contexts = build_inference_model(size, variant, "fused", 8, 8, 512, torch.device("cuda"), torch.bfloat16)
    return lambda: model.generate(contexts, 1 + new)


def main(argv=None) -> None:
    kind, size, what = (argv or sys.argv[1:])[:3]
    fn = {"op": _op_fn, "train": _train_fn, "generate": _generate_fn}[kind](size, what)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    iters = 3
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall_noprof = (time.perf_counter() - t0) * 1e3 / iters
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total / 1e3 / iters
            per[e.name][1] += 1
    total = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values()) / iters
    print(f"PROFILE {kind} {size} {what}: wall {wall_noprof:.2f} ms/iter (profiled {wall:.2f}), "
          f"CUDA kernels {total:.2f} ms/iter, {n:.0f} kernels/iter")
    for name, (ms, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {ms:8.3f} ms  x{cnt / iters:5.0f}  {name[:110]}")
    if kind == "generate":  # where the host time goes
        print("  top CPU operators (self time):")
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]:
            print(f"  {e.self_cpu_time_total / 1e3 / iters:8.3f} ms  x{e.count / iters:6.0f}  {e.key[:100]}")


if __name__ == "__main__":
    main()
