"""The routing operation alone, forward and backward, per routing implementation (``mhar.model.config.ROUTING_IMPLS``).

Two measurements per model size (shapes and micro-batch of mhar.model.presets, the paper's microbatch, H heads):

* ``microbatch`` (default): every routing call of one microbatch (2L+1 reads interleaved with appends, each read
  announcing the reads after it, as the model does; sources independent random tensors), as in a training step;
* ``read``: one routing call over all N = 2L+1 sources (the final read; the N appends that build its state are
  timed with it).

Columns: ms (median, triton.testing.do_bench; ``--graph 1``: median CUDA-graph replay: kernel time only) for fwd
and fwd+bwd (bwd = difference); ``min_bytes`` = what a one-pass-per-call algorithm must move and its effective
GB/s; for fused rows ``model_gb`` / ``model_gbps``: the bytes of the fused kernels' byte model
(``benchmarks.traffic_bound.fused_bytes``) and the bandwidth they are moved at, as fractions of the measured HBM
copy bandwidth too. ``fused_nopdl``: the fused kernels without programmatic dependent launch (MHAR_ROUTING_PDL=0
while its case runs; ``fused`` runs the library's default, on sm_90+); ``routing_env`` records each row's
settings, ``pdl`` whether the kernels launched with it.

    PYTHONPATH=. python -m benchmarks.bench_routing_op --sizes 100M 350M 1B --heads 8 --graph 1 \
        --impls eager fused fused_nopdl --out results/bench/routing_op.csv --append
"""
from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton.testing

from benchmarks.common import (NO_PDL, add_out_args, apply_settings, env_columns, existing_rows, microbatch,
                               kernel_settings, measure_hbm_bandwidth, routing_env_cell, tuned_lines, write_csv)
from benchmarks.traffic_bound import fused_bytes, fused_config, min_bytes
from mhar.model.config import ROUTING_IMPLS
from mhar.model.presets import PRESETS
from mhar.model.routing import get_router, resolve_routing_impl
from mhar.model.routing._kernels import pdl_enabled

IMPLS = (*ROUTING_IMPLS, "fused" + NO_PDL)  # the routing implementations, and fused without PDL


@contextmanager
def kernel_setting(impl: str):
    """The routing kernel settings of ``impl`` (``common.kernel_settings``) while its case runs; the caller's
    environment comes back afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(apply_settings(saved, kernel_settings(impl)[1]))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class Case:
    size: str
    B: int
    T: int
    D: int
    H: int
    N: int  # sources at the final read (2L + 1)


def _inputs(c: Case, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    srcs = [torch.randn(c.B, c.T, c.D, device="cuda", dtype=dtype, generator=g).requires_grad_()
            for _ in range(c.N)]
    qs = [(0.1 * torch.randn(c.D, device="cuda", generator=g)).requires_grad_() for _ in range(c.N)]
    gs = [(1 + 0.1 * torch.randn(c.D, device="cuda", generator=g)).requires_grad_() for _ in range(c.N)]
    return srcs, qs, gs


def _build(router, srcs):
    st = router.init(srcs[0], capacity=len(srcs))
    for s in srcs[1:]:
        st = router.append(st, s)
    return st


def _microbatch(router, srcs, qs, gs, H):
    """Every read of one microbatch; each announces the queries of the reads after it (as the model does)."""
    st = router.init(srcs[0], capacity=len(srcs))
    Q, G = torch.stack(qs), torch.stack(gs)
    outs = []
    for i in range(len(srcs)):
        outs.append(router.read(st, Q[i], G[i], H, lookahead=(Q[i + 1:], G[i + 1:])))  # reads i+1 sources
        if i + 1 < len(srcs):
            st = router.append(st, srcs[i + 1])
    return outs


def model_bytes(impl: str, ns: list[int], E: int, H: int, D: int) -> tuple[int, int] | None:
    """(fwd, bwd) bytes of the fused kernels' byte model for what ``impl`` runs (``fused_bytes`` with
    ``fused_config``), None for implementations that do not run them on a GPU (eager, compile)."""
    if resolve_routing_impl(kernel_settings(impl)[0], "cuda") != "fused":
        return None
    return fused_bytes(ns, E, H, D, **fused_config(H, D))


def graph_ms(fn, warmup: int = 3, reps: int = 30) -> float:
    """Median ms of one CUDA-graph replay of ``fn``. Warm-up (autotuning included) and capture run on ONE side
    stream, PyTorch's capture recipe (the training step's too): autograd nodes made by a warm-up on another stream
    and kept alive (the leaves' AccumulateGrad) would make the captured backward sync with the legacy stream,
    which invalidates the capture (triton.testing.do_bench_cudagraph warms up and captures on two streams)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del g
    return sorted(times)[len(times) // 2]


def bench_case(c: Case, impl: str, mode: str, graph: bool = False) -> dict:
    """One row: ``impl`` (one of ``IMPLS``; its kernel settings while it runs) on case ``c``."""
    name, _ = kernel_settings(impl)
    with kernel_setting(impl):
        row = _bench_case(c, name, mode, graph)
        row.update(impl=impl, routing_env=routing_env_cell(),
                   pdl=int(torch.cuda.is_available() and pdl_enabled(torch.device("cuda"))))
    return row


def _bench_case(c: Case, impl: str, mode: str, graph: bool = False) -> dict:
    router = get_router(impl)
    srcs, qs, gs = _inputs(c)
    if mode == "read":  # one read over N sources; the state (N appends) is built per call, as in a forward
        def fwd():
            return [router.read(_build(router, srcs), qs[-1], gs[-1], c.H)]
        ns = [c.N]
    else:
        def fwd():
            return _microbatch(router, srcs, qs, gs, c.H)
        ns = list(range(1, c.N + 1))
    douts = [torch.randn(c.B, c.T, c.D, device="cuda", dtype=torch.bfloat16) for _ in ns]
    params = srcs + qs + gs

    def fwd_bwd():
        outs = fwd()
        torch.autograd.backward(outs, douts[: len(outs)])
        for p in params:
            p.grad = None
    try:
        if graph:  # replayed CUDA graphs: kernel time without the per-call CPU work (as in a graphed step)
            t_fb = graph_ms(fwd_bwd)
            t_f = graph_ms(fwd)
        else:
            fwd_bwd()  # warm-up / compile
            t_f = triton.testing.do_bench(fwd, warmup=5, rep=50, return_mode="median")
            t_fb = triton.testing.do_bench(fwd_bwd, warmup=5, rep=50, return_mode="median")
        status = "ok"
    except torch.OutOfMemoryError:
        t_f = t_fb = float("nan")
        status = "OOM"
    torch.cuda.empty_cache()
    bf, bb = min_bytes(ns, c.B * c.T * c.D)
    mb = model_bytes(impl, ns, c.B * c.T * c.D, c.H, c.D)
    row = dict(size=c.size, mode=mode, impl=impl, cuda_graph=int(graph), B=c.B, T=c.T, D=c.D, H=c.H, N=c.N,
               reads=len(ns), status=status, fwd_ms=round(t_f, 4), fwd_bwd_ms=round(t_fb, 4),
               bwd_ms=round(t_fb - t_f, 4), fwd_min_bytes=bf, bwd_min_bytes=bb,
               fwd_gbps=round(bf / (t_f * 1e-3) / 1e9, 1), bwd_gbps=round(bb / ((t_fb - t_f) * 1e-3) / 1e9, 1),
               model_fwd_bytes="", model_bwd_bytes="", model_gb="", model_gbps="")
    if mb is not None:  # what the fused kernels move (their byte model) and the bandwidth that achieves
        row.update(model_fwd_bytes=mb[0], model_bwd_bytes=mb[1], model_gb=round(sum(mb) / 1e9, 3),
                   model_gbps=round(sum(mb) / (t_fb * 1e-3) / 1e9, 1))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--impls", nargs="+", default=["eager", "fused"], choices=IMPLS)
    ap.add_argument("--modes", nargs="+", default=["microbatch"])
    ap.add_argument("--graph", type=int, choices=(0, 1), default=0,
                    help="1: time CUDA-graph replays (triton.testing.do_bench_cudagraph): kernel time only")
    add_out_args(ap, "results/bench/routing_op.csv")
    args = ap.parse_args(argv)
    keep = existing_rows(args.out, args.append)  # before any run: an existing record is never overwritten
    torch._dynamo.config.cache_size_limit = 512  # compile: one graph per distinct number of sources
    hbm = measure_hbm_bandwidth()
    print(f"measured HBM copy bandwidth: {hbm:.0f} GB/s")
    env = env_columns("benchmarks.bench_routing_op", argv)
    rows, tuned = [], set()
    for size in args.sizes:
        p = PRESETS[size].model
        B, T = microbatch(size)
        c = Case(size, B, T, p["d_model"], args.heads, 2 * p["n_layers"] + 1)
        for mode in args.modes:
            for impl in args.impls:
                if mode == "microbatch" and impl == "compile":
                    continue  # 2L+1 distinct graphs to compile: measured in the training benchmark instead
                r = bench_case(c, impl, mode, graph=bool(args.graph))
                r.update(hbm_gbps=round(hbm, 1), fwd_frac_hbm=round(r["fwd_gbps"] / hbm, 3),
                         bwd_frac_hbm=round(r["bwd_gbps"] / hbm, 3),
                         model_frac_hbm=round(r["model_gbps"] / hbm, 3) if r["model_gbps"] != "" else "", **env)
                rows.append(r)
                print({k: r[k] for k in ("size", "mode", "impl", "status", "fwd_ms", "bwd_ms", "fwd_bwd_ms",
                                         "model_gb", "model_gbps", "model_frac_hbm")}, flush=True)
                print("\n".join(tuned_lines(tuned)), flush=True)  # the autotuner's choices for this case
                write_csv(args.out, rows, keep)
    by = {(r["size"], r["mode"], r["impl"]): r for r in rows}
    for (size, mode, impl), r in by.items():  # side by side: each implementation against eager in the same call
        ref = by.get((size, mode, "eager"))
        if impl != "eager" and ref and r["status"] == ref["status"] == "ok":
            print(f"{size} {mode}: {impl} {r['fwd_bwd_ms']:.3f} ms ({r['model_gb']} GB, {r['model_gbps']} GB/s) vs "
                  f"eager {ref['fwd_bwd_ms']:.3f} ms: {ref['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x faster", flush=True)

if __name__ == "__main__":
    main()
