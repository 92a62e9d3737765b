"""Where the time of a routed step goes: CUDA kernel time vs wall time, top kernels (torch.profiler).

    PYTHONPATH=. python benchmarks/profile_step.py op 350M fused        # every routing call of one microbatch
    PYTHONPATH=. python benchmarks/profile_step.py op 350M fused_v5     # (impl names: bench_routing_op._router)
    PYTHONPATH=. python benchmarks/profile_step.py train 100M mhar_fused    # (variants: bench_training.VARIANTS)

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


def main(argv=None) -> None:
    kind, size, what = (argv or sys.argv[1:])[:3]
    fn = _op_fn(size, what) if kind == "op" else _train_fn(size, what)
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


if __name__ == "__main__":
    main()
