"""Benchmark the routing operation alone: eager / compile / fused, forward and backward.

Two measurements per model size (shapes of mhar.config PRESETS, the paper's microbatch, H heads):

* ``read``: one routing call over all N = 2L+1 sources (the final read; the N appends that build its state
  are timed with it), stateful Router API;
* ``microbatch``: every routing call of one microbatch (2L+1 reads interleaved with
  appends, sources independent random tensors), as in a training step.

Columns: ms (median, triton.testing.do_bench; ``--graph 1``: median CUDA-graph replay, ``graph_ms``) for fwd and fwd+bwd (bwd = difference),
``min_bytes`` = what a one-pass-per-call algorithm must move (fwd: read n sources,
write the output; bwd: read n sources and dout, write n source gradients), effective
GB/s = min_bytes / time and its fraction of the measured HBM copy bandwidth.

An implementation name ending in ``_pdl`` (``fused_t_g4_sg8_pdl``) is the same kernels launched with programmatic
dependent launch (``MHAR_ROUTING_PDL=1`` while its case runs: the library's default on sm_90+); the other fused
names run with ``MHAR_ROUTING_PDL=0``, so a name always means the same launches: ``--impls fused_t_g4_sg8
fused_t_g4_sg8_pdl`` compares both in one call; ``routing_env`` records each row's kernel settings. Likewise
``_heads`` before it (the all-heads scoring kernel, ``MHAR_ROUTING_SCORE=heads``; without it ``head``):
``fused_t_g4_sg8_heads_pdl``.

Default: ``fused`` (kernels v6) and ``fused_v5`` side by side, microbatch mode; ``model_gb`` / ``model_gbps``
are the bytes of each kernel version's byte model (``v6_bytes`` / ``v5_bytes``, as in traffic_bound.py) and
the bandwidth they are moved at (``--graph 1``: CUDA-graph replays, kernel time only).

    PYTHONPATH=. python benchmarks/bench_routing_op.py --sizes 100M 350M 1B --heads 8 --graph 1 \
        --out results/bench/routing_op.csv --append
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from unittest import mock

import torch
import triton.testing

from benchmarks.common import (add_out_args, env_columns, existing_rows, kernel_settings, measure_hbm_bandwidth,
                               routing_env_cell, tuned_lines, write_csv)
from mhar.config import PRESETS
from mhar.routing import get_router

def impl_settings(impl: str) -> tuple[str, dict]:
    """A fused name -> (the router's name, its kernel settings: ``common.kernel_settings``); other names ->
    (impl, {})."""
    return kernel_settings(impl) if impl.startswith("fused") else (impl, {})


def kernel_setting(impl: str):
    """The block's kernel settings for ``impl`` (restored after; ``impl_settings``): MHAR_ROUTING_PDL 1 for a
    fused ``_pdl`` name, 0 for the other fused names (PDL is the library's default on sm_90+), the scoring kernel
    likewise; the caller's settings for the rest (no Triton kernels)."""
    return mock.patch.dict(os.environ, impl_settings(impl)[1])


MICROBATCH = {"100M": (8, 2048), "350M": (4, 1024), "1B": (2, 1024), "debug": (2, 64), "tiny": (2, 128)}


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


def min_bytes(ns: list[int], E: int, elt: int = 2) -> tuple[int, int]:
    """(fwd, bwd) bytes of a one-pass-per-call algorithm for reads over ns sources, E = B*T*D."""
    fwd = sum((n + 1) * E * elt for n in ns)
    bwd = sum((2 * n + 1) * E * elt for n in ns)
    return fwd, bwd


def v5_bytes(ns: list[int], E: int, elt: int = 2) -> tuple[int, int]:
    """(fwd, bwd) bytes of the v5 kernels: forward reads every read's sources, backward reads them and
    read-modify-writes each one's gradient slot (outputs, douts: O(N), left out as in the v5 record)."""
    unit = sum(ns) * E * elt
    return unit, 3 * unit


def backward_passes(ns: list[int], source_group: int, defer: int = 0):
    """The source-gradient passes of the v6 backward for reads over ns sources, in the order they run (the rule
    of ``mhar.routing.fused._source_group``: backward visits reads newest first; a read's newest new source
    starts a group with the older consecutive slots first seen by earlier reads and not yet in a group, up to
    ``source_group`` in all). Yields ``("pass", k, members)``: one pass over reads k..N-1 for the slots
    ``members`` (one slot: the plain write-once pass; several: a group pass writing a partial gradient for every
    member, the newest completed at once with no reads, as its RMS term needs every head), and
    ``("complete", slot, k, k_end)``: a group member completed by its first reader k over reads k..k_end-1.
    ``defer`` = d > 0 (``mhar.routing.fused._deferred_group``): after its own slots, the backward of read k also
    starts the group of the newest slot first seen by read k - d, if that slot is in no group yet (every member
    partial, completed by its first reader over the reads before k)."""
    first = {}  # slot -> first reader
    seen = 0
    for k, n in enumerate(ns):
        for s_ in range(seen, n):
            first[s_] = k
        seen = max(seen, n)
    partial: dict = {}  # group member -> the read whose backward formed its partial
    for k in range(len(ns) - 1, -1, -1):
        new = [s_ for s_ in first if first[s_] == k]
        for s_ in new:
            if s_ in partial:
                yield "complete", s_, k, partial.pop(s_)
                continue
            members = [s_]
            if source_group > 1 and s_ == max(new):  # older consecutive slots first seen by earlier reads
                o = s_ - 1
                while s_ - o < source_group and o >= 0 and first.get(o, len(ns)) < k and o not in partial:
                    members.insert(0, o)
                    o -= 1
                partial.update((m, k) for m in members[:-1])
            yield "pass", k, members
        tops = [s_ for s_ in first if first[s_] == k - defer] if defer > 0 and source_group > 1 and k - defer >= 0 else []
        if tops and max(tops) not in partial:
            members = [max(tops)]
            o = members[0] - 1
            while len(members) < source_group and o >= 0 and first.get(o, len(ns)) <= k - defer and o not in partial:
                members.insert(0, o)
                o -= 1
            if len(members) > 1:
                partial.update((m, k) for m in members)
                yield "pass", k, members


def _dout_passes(ns: list[int], source_group: int, defer: int = 0) -> tuple[int, int]:
    """(douts read, partial gradients) of the v6 backward for reads over ns sources when up to ``source_group``
    consecutive sources share one pass (``backward_passes``): a pass over reads k.. reads N - k douts, a
    completion k_end - k; a group pass writes a partial for each of its members."""
    douts = parts = 0
    for ev in backward_passes(ns, source_group, defer):
        if ev[0] == "complete":
            douts += ev[3] - ev[2]
        else:
            douts += len(ns) - ev[1]
            parts += len(ev[2]) if len(ev[2]) > 1 else 0
    return douts, parts


def v6_bytes(ns: list[int], E: int, H: int, D: int, elt: int = 2, group: int = 1,
             source_group: int = 1, table: bool = False, group_scores: bool = False,
             async_scores: bool = False, defer_groups: int = 0) -> tuple[int, int]:
    """(fwd, bwd) bytes of the v6 kernels for reads over ns sources (non-decreasing, each read the first to
    see its newest source), E = B*T*D elements per source. ``group`` > 1: forward prefix sharing (groups of
    that many reads: one pass over the first read's sources writes a partial per read, which each read reads
    back with its newer sources). Each source's sum of squares per token (fp32, written by the append) is read
    with the source by every read that scores it (the prefix kernel reduces the row itself) and once by its
    gradient kernel. ``source_group`` > 1: consecutive sources share one pass over the later reads' douts; each
    partial gradient costs an fp32 write and read and its completion pass reads the source again.
    ``table`` (v7): each source is read once more (with its sums of squares) to write its score rows for every
    read that sees it (fp32, H per token); the reads take their scores from the table (read twice: the max, then
    the mix) instead of the sums of squares, and the gradient kernel reads each (source, read) row once.
    ``group_scores`` (``_ts``: the source-group pass reads its sources' rows instead of recomputing the scores)
    moves those row reads between kernels without changing their number: the same bytes. ``async_scores``
    (``_async``: each source scored at its append): a group after the first stops its prefix before its first
    read's newest source, which each of the group's reads then reads itself with its sums of squares (its own
    scores); the table is read for the prefix only. ``defer_groups`` = d (``_defer``): each group pass below the
    newest group starts d reads later (d douts fewer) and each of its members' completions covers d reads more
    (``backward_passes(defer=d)``)."""
    del group_scores  # (accepted so that every routing implementation's options reach the model)
    unit = sum(ns) * E * elt
    N = len(ns)
    ss = (E // D) * 4  # one source's sums of squares
    sb = (E // D) * H * 4  # one source's score row for one read
    per_src = 2 * sb if table else ss  # per (read, source): what a read reads besides the source itself
    fwd = N * ss  # the appends write them
    if table:  # scoring: read each source and its sums of squares, write its rows
        fwd += N * (E * elt + ss) + sum(ns) * sb
    for a in range(0, N, group):
        K = min(group, N - a)
        if K == 1:
            fwd += (ns[a] + 1) * E * elt + ns[a] * per_src  # read the sources, write the output
        else:  # prefix once, K partials written and read back, each read's newer sources and output
            late = async_scores and table and a > 0 and ns[a] > 1  # the group's newest source after the prefix
            p, new_src = (ns[a] - 1, ss) if late else (ns[a], per_src)
            fwd += (p + 2 * K + sum(ns[i] - p + 1 for i in range(a, a + K))) * E * elt + \
                sum(ns[i] - p for i in range(a, a + K)) * new_src + (K * p * 2 * sb if table else 0)
    # dL/dscore per (token, head, read, source), in the sources' dtype: written by the gradient kernel into one
    # (H, reads, sources x tokens) buffer, zeroed first and read whole (zeros too) by the single dW matmul
    dsr = sum(ns) * (E // D) * H * elt + 2 * N * N * (E // D) * H * elt
    # stash: read dout + out, write the dout slot (3); per source: read it in the kernel and in the dW matmul
    # (2), write its gradient (1)
    douts, parts = _dout_passes(ns, source_group, defer_groups)
    # a partial: fp32 written by the group pass and read by the completion pass, which reads the source again
    # (and its sums of squares); its RMS-term sums cpart (H fp32 per token) written and read
    bwd = douts * E * elt + dsr + 6 * N * E * elt + N * ss + parts * (5 * E * elt + ss + 2 * sb)
    if table:
        bwd += sum(ns) * sb
    return fwd, bwd


def _v6_options(impl: str) -> dict:
    """``fused_sgG`` -> source_group G; ``fused_gK_sgG`` -> group K and source_group G; a part ``t`` (``fused_t``,
    ``fused_t_g4``): the v7 score table; a part ``ts`` (``fused_t_g4_sg8_ts``): the group pass reads its scores;
    a part ``async`` (``fused_t_g4_sg8_async``): each source scored at its append on a side stream; a part ``dfD``
    (``fused_t_g4_sg8_df1``): source-group passes D reads early on a side stream (``defer_groups``)."""
    opts = {}
    for part in impl[len("fused_"):].split("_"):
        if part == "t":
            opts["table"] = True
        elif part == "ts":  # (after "sgG"): the group pass reads the table's scores
            opts["group_scores"] = True
        elif part == "async":  # each source scored at its append, on a side stream
            opts["async_scores"] = True
        elif part.startswith("df"):  # "dfD": source-group passes D reads early, on a side stream
            opts["defer_groups"] = int(part[2:])
        elif part.startswith("sg"):
            opts["source_group"] = int(part[2:])
        elif part.startswith("g"):
            opts["group"] = int(part[1:])
        else:
            raise ValueError(f"unknown routing implementation {impl!r}")
    return opts


def _router(impl: str):
    """eager | compile | fused (kernels v6: source-major, write-once backward) | fused_t (v6 with the v7 score
    table) | fused_t_gK (score table and forward groups of K) | fused_gK (v6 with forward
    prefix sharing in groups of K reads) | fused_sgG (v6, gradients of G consecutive sources from one pass) |
    fused_gK_sgG (both) | fused_v5 (the previous read-major kernels, no prefix sharing) |
    fused_auto (v5, groups of about sqrt(reads)) | fused_v5_gK (v5, groups of K reads) | fused_fp32acc (v5,
    source gradients accumulated in fp32)."""
    from mhar.routing.fused import FusedRouter
    if impl == "fused_fp32acc":
        return FusedRouter(algo="v5", grad_dtype=torch.float32)
    if impl.startswith("fused_v5_g"):
        return FusedRouter(algo="v5", group=int(impl[len("fused_v5_g"):]))
    if impl.startswith(("fused_sg", "fused_g", "fused_t")):
        return FusedRouter(**_v6_options(impl))
    if impl == "fused_auto":
        return FusedRouter(algo="v5", group="auto")
    if impl == "fused_v5":
        return FusedRouter(algo="v5", group=1)
    if impl == "fused":
        return FusedRouter()
    return get_router(impl)


def model_bytes(impl: str, ns: list[int], E: int, H: int, D: int) -> tuple[int, int] | None:
    """(fwd, bwd) bytes of the byte model of the fused kernels (``v6_bytes`` / ``v5_bytes``), None for others."""
    if impl == "fused":
        return v6_bytes(ns, E, H, D)
    if impl.startswith(("fused_sg", "fused_g", "fused_t")):
        return v6_bytes(ns, E, H, D, **_v6_options(impl))
    if impl in ("fused_v5", "fused_fp32acc"):
        return v5_bytes(ns, E)
    return None


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
    """One row: ``impl`` (its kernel-choice suffixes, ``_heads`` / ``_pdl``, set while it runs) on case ``c``."""
    kernels, _ = impl_settings(impl)
    with kernel_setting(impl):
        row = _bench_case(c, kernels, mode, graph)
        row.update(impl=impl, routing_env=routing_env_cell())
    return row


def _bench_case(c: Case, impl: str, mode: str, graph: bool = False) -> dict:
    router = _router(impl)
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
    if mb is not None:  # what this kernel version moves (its byte model) and the bandwidth that achieves
        row.update(model_fwd_bytes=mb[0], model_bwd_bytes=mb[1], model_gb=round(sum(mb) / 1e9, 3),
                   model_gbps=round(sum(mb) / (t_fb * 1e-3) / 1e9, 1))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--impls", nargs="+", default=["fused", "fused_v5"])
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
        p = PRESETS[size]
        B, T = MICROBATCH[size]
        c = Case(size, B, T, p["d_model"], args.heads, 2 * p["n_layers"] + 1)
        for mode in args.modes:
            for impl in args.impls:
                if mode == "microbatch" and impl == "compile" or mode == "read" and "_g" in impl:
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
    for (size, mode, impl), r in by.items():  # side by side: v6 against v5 in the same call
        old = by.get((size, mode, "fused_v5"))
        if impl.startswith("fused") and impl != "fused_v5" and old and r["status"] == old["status"] == "ok":
            print(f"{size} {mode}: {impl} {r['fwd_bwd_ms']:.3f} ms ({r['model_gb']} GB, {r['model_gbps']} GB/s) "
                  f"vs fused_v5 {old['fwd_bwd_ms']:.3f} ms ({old['model_gb']} GB, {old['model_gbps']} GB/s): "
                  f"{old['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x faster", flush=True)


if __name__ == "__main__":
    main()
