"""What bounds MHAR's training-throughput ratio when routing makes one pass over its sources per read.

Per size (the paper's microbatch, bf16 sources of E = B*T*D elements): the routing reads of one
microbatch see n = 1, 2, ..., 2L+1 sources (each sublayer reads the embedding and every earlier
sublayer output; the final norm reads all 2L+1; ``routing_reads`` counts them on a real model in the
tests). One byte "unit" = sum_n n * E * 2 bytes. Moved per microbatch:

* ``v5`` (``routing_impl: fused_v5``): forward reads the sources (1 unit), backward reads them and
  read-modify-writes a gradient slot per source (3 units): 4 units;
* ``v6`` (``routing_impl: fused``, ``v6_bytes``): the same forward (1 unit + the outputs); the source-major
  backward reads, per source, the douts of the reads that saw it (1 unit in all), plus dsr (H values per token
  and read-source pair in the sources' dtype, written: H/D of a unit, into one (H, reads, sources x tokens)
  buffer zeroed first and read whole by the one dW matmul: 2 x reads x sources x tokens x H more) and per source / read
  O(N) terms: stash (read dout and out, write the dout buffer), the source read twice (kernel and dW matmul),
  its gradient written once: about 2 units + 7N source sizes; ``v6_g8``: the same with forward prefix sharing
  in groups of 8 reads (``FusedRouter(group=8)``, the ``fused_g8`` row of bench_routing_op): the forward reads each
  group's common prefix once, plus a partial per read written and read back; ``v6_sg8``: the backward with
  source groups of 8 (``FusedRouter(source_group=8)``, routing_impl ``fused_sg8``): 8 consecutive sources share
  one pass over the later reads' douts (a partial per source in fp32, completed by its first reader);
  ``v6_g8_sg8``: both;
* ``v7_g4`` (``routing_impl: fused_v7``): v6 with the score table and forward groups of 4: each source read once
  more to write its fp32 scores for every read that sees it; the reads and the prefix pass read score rows
  (twice: the max, then the mix) instead of re-scoring; the gradient kernel reads one row per (source, read);
  ``v7_g4_sg8`` (``routing_impl: fused_v7_sg8``): with source groups of 8 in the backward;
  ``v7_g4_sg8_norm`` (``routing_impl: fused_v7_sg8_norm``): the same routing bytes minus what fusing each
  sublayer's pre-norm into its read removes from the step (``PRENORM_SAVED`` source-sized passes per sublayer
  read: the norm's backward no longer writes dh and reads it back with h, and the read's kernel norms the rows it
  holds instead of a norm kernel reading the mix again); the final readout keeps its separate norm;
  ``v7_g4_sg8_async`` (``routing_impl: fused_v7_sg8_async``): sources scored at their appends; each later group's
  prefix stops one source early and its reads score the sources after their prefix themselves (more bytes
  than ``v7_g4_sg8``; what it buys is the scoring off the critical path, which bytes do not show);
  ``v7_g4_sg8_overlap`` (``routing_impl: fused_v7_sg8_overlap``): that plus the source-group passes started one
  read early on a side stream (``defer_groups``: each member's completion covers one read more);
* ``min``: any one-pass-per-read algorithm (``bench_routing_op.min_bytes``: forward reads the sources and
  writes the output, backward reads sources and dout and writes each source gradient once).

At the measured HBM bandwidth (``hbm_gbps`` of routing_op.csv) that is ``ideal_ms``; with the measured
baseline step (training.csv) the throughput ratio cannot exceed base / (base + ideal), whatever the
kernels. The measured ratio and step gap (MHAR fused minus baseline) are printed beside it.

    PYTHONPATH=. python -m benchmarks.traffic_bound --training results/bench/training.csv \
        --op results/bench/routing_op.csv --out results/bench/traffic_bound.csv

Per kernel (``kernel_bytes``, fused_v7_sg8): each routing kernel's bytes beside the CUDA ms that
``benchmarks/profile_step.py --json`` measured, i.e. which kernel is how far from the bandwidth:

    PYTHONPATH=. python -m benchmarks.traffic_bound --profile results/bench/profile_train_1B.json
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from benchmarks.bench_routing_op import MICROBATCH, backward_passes, min_bytes, v6_bytes
from benchmarks.common import command_line, write_csv
from mhar.provenance import git_info
from mhar.config import PRESETS
from mhar.routing import DEFER_READS, SOURCE_GROUP, V7_GROUP

BYTES_PER_ELT = 2  # bf16 sources under autocast
V6_GROUP = 8  # reads per forward prefix-sharing group of the v6 row with sharing (FusedRouter(group=8))
PRENORM_SAVED = 4  # source-sized passes per sublayer read removed by the fused pre-norm: 3 backward, 1 forward
# V7_GROUP: reads per forward group of routing_impl fused_v7 (the score table: FusedRouter(table=True, group=4))


def routing_reads(n_layers: int) -> list[int]:
    """Sources seen by each routing read of one forward: 2L sublayer reads (1..2L), then the final read."""
    return list(range(1, 2 * n_layers + 2))


def unit_bytes(size: str) -> int:
    """One pass over the sources of every read of one microbatch (bytes)."""
    B, T = MICROBATCH[size]
    cfg = PRESETS[size]
    return sum(routing_reads(cfg["n_layers"])) * B * T * cfg["d_model"] * BYTES_PER_ELT


FUSED_VARIANTS = ("mhar_fused", "mhar_fused_sub")  # bench_training's name, and the name of records before 2026-12-01


def bound_rows(training: list[dict], hbm_gbps: float, fused: tuple = FUSED_VARIANTS, heads: int = 8) -> list[dict]:
    fused = (fused,) if isinstance(fused, str) else tuple(fused)
    training = [r for r in training if r.get("mode", "step") != "trainer"]  # the step rows (same step, one each)
    rows = []
    for size in ("100M", "350M", "1B"):
        base = next((r for r in training if r["size"] == size and r["variant"] == "baseline"
                     and r.get("status", "ok") == "ok"), None)
        if base is None:
            continue
        cfg, (B, T) = PRESETS[size], MICROBATCH[size]
        unit = unit_bytes(size)
        mb_f, mb_b = min_bytes(routing_reads(cfg["n_layers"]), B * T * cfg["d_model"], BYTES_PER_ELT)
        base_ms = float(base["step_ms"])
        row = dict(size=size, reads=2 * cfg["n_layers"] + 1, unit_gb=round(unit / 1e9, 3), hbm_gbps=hbm_gbps,
                   base_ms=base_ms)
        row.update({k: base.get(k, "") for k in ("gpu", "driver", "torch", "triton")})  # of the measurements used
        ns, E = routing_reads(cfg["n_layers"]), B * T * cfg["d_model"]
        v6_f, v6_b = v6_bytes(ns, E, heads, cfg["d_model"])
        v6g_f, v6g_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V6_GROUP)
        v6s_f, v6s_b = v6_bytes(ns, E, heads, cfg["d_model"], source_group=SOURCE_GROUP)
        v6gs_f, v6gs_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V6_GROUP, source_group=SOURCE_GROUP)
        v7_f, v7_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V7_GROUP, table=True)
        v7s_f, v7s_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V7_GROUP, table=True, source_group=SOURCE_GROUP)
        v7a_f, v7a_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V7_GROUP, table=True, source_group=SOURCE_GROUP,
                                async_scores=True)
        v7o_f, v7o_b = v6_bytes(ns, E, heads, cfg["d_model"], group=V7_GROUP, table=True, source_group=SOURCE_GROUP,
                                async_scores=True, defer_groups=DEFER_READS)
        for name, nbytes in (("v5", 4 * unit), ("v6", v6_f + v6_b), (f"v6_g{V6_GROUP}", v6g_f + v6g_b),
                             (f"v6_sg{SOURCE_GROUP}", v6s_f + v6s_b),
                             (f"v6_g{V6_GROUP}_sg{SOURCE_GROUP}", v6gs_f + v6gs_b),
                             (f"v7_g{V7_GROUP}", v7_f + v7_b), (f"v7_g{V7_GROUP}_sg{SOURCE_GROUP}", v7s_f + v7s_b),
                             (f"v7_g{V7_GROUP}_sg{SOURCE_GROUP}_norm",
                              v7s_f + v7s_b - PRENORM_SAVED * 2 * cfg["n_layers"] * E * BYTES_PER_ELT),
                             (f"v7_g{V7_GROUP}_sg{SOURCE_GROUP}_async", v7a_f + v7a_b),
                             (f"v7_g{V7_GROUP}_sg{SOURCE_GROUP}_overlap", v7o_f + v7o_b),
                             ("min", mb_f + mb_b)):
            ideal = nbytes / (hbm_gbps * 1e9) * 1e3
            row[f"{name}_gb"] = round(nbytes / 1e9, 3)
            row[f"{name}_ideal_ms"] = round(ideal, 2)
            row[f"{name}_bound_ratio"] = round(base_ms / (base_ms + ideal), 4)
        run = next((r for r in training if r["size"] == size and r["variant"] in fused
                    and r.get("status", "ok") == "ok"), None)
        row["measured_ratio"] = round(base_ms / float(run["step_ms"]), 4) if run else None
        row["measured_gap_ms"] = round(float(run["step_ms"]) - base_ms, 2) if run else None
        rows.append(row)
    return rows


# Kernels of routing_impl fused_v7_sg8 (score table, forward groups, source groups) in ``kernel_bytes``.
V7_KERNELS = ("_append_kernel", "_score_kernel", "_prefix7_kernel", "_fwd7_kernel", "_stash_kernel",
              "_src_group_bwd_kernel", "_src_bwd_kernel")


def kernel_bytes(size: str, heads: int = 8, group: int = V7_GROUP, source_group: int = SOURCE_GROUP) -> dict:
    """Per routing kernel of ``fused_v7_sg8`` at a preset (the paper's microbatch, bf16 sources): (launches, HBM
    bytes) per microbatch, each load and store of the kernel (``mhar/routing/_kernels.py``) counted once: L2 hits
    are not subtracted, so bytes / bandwidth is a lower bound on the kernel's time. Read k (k = 0..N-1, N = 2L+1)
    sees sources 0..k. Forward: every append copies its source and writes its sums of squares; every source is
    scored once for the reads from its first reader on (H fp32 per token and read); a group of ``group`` reads
    makes one prefix pass over its first read's sources (their score rows twice: the max, then the mix) writing
    a partial and lse per read, and each read then mixes its newer sources into its partial. Backward, newest
    read first (``bench_routing_op.backward_passes``): each read stashes its dout; a read's new
    source either completes a group member (its douts, lse, delta and score rows for the reads since its first
    reader, the fp32 partial and its RMS sums in, the gradient and dsr out) or starts a group pass over up to
    ``source_group`` consecutive sources and every later read's dout (fp32 partials and RMS sums out, dsr out;
    the newest member completed at once), or, alone, one pass over its later reads. Not counted: the dsr
    buffer's zero fill and the one dW matmul (``dW_all``), which the aggregate model (``v6_bytes``) includes,
    and the append's copy, which it leaves out; the totals agree within 2% (``tests/test_traffic_bound.py``)."""
    B, T = MICROBATCH[size]
    D, L = PRESETS[size]["d_model"], PRESETS[size]["n_layers"]
    N, BT, H = 2 * L + 1, B * T, heads
    src, f32 = BT * D * BYTES_PER_ELT, BT * D * 4  # a source / dout / output / partial; an fp32 gradient partial
    ss, row = BT * 4, BT * H * 4  # one source's sums of squares; one (source, read) score / lse / delta row
    dsr = BT * H * BYTES_PER_ELT  # one (source, read) dsr row (the sources' dtype)
    calls = dict.fromkeys(V7_KERNELS, 0)
    out = dict.fromkeys(V7_KERNELS, 0)

    def add(kernel: str, nbytes: int) -> None:
        calls[kernel] += 1
        out[kernel] += nbytes

    for j in range(N):
        add("_append_kernel", 2 * src + ss)
        add("_score_kernel", src + ss + (N - j) * row)
        add("_stash_kernel", 3 * src + row)
    for a in range(0, N, group):
        K = min(group, N - a)
        if K > 1:
            add("_prefix7_kernel", (a + 1) * (src + 2 * K * row) + K * (src + row))
        for i in range(a, a + K):
            newer = i - a if K > 1 else i + 1  # sources past the prefix
            add("_fwd7_kernel", (src + row if K > 1 else 0) + newer * (src + 2 * row) + src + row)
    for ev in backward_passes(routing_reads(L), source_group):  # read k's one new source is slot k
        if ev[0] == "complete":  # a group member over its reads k..k_end-1: douts, lse, delta, scores; dsr out
            n = ev[3] - ev[2]
            add("_src_bwd_kernel", n * (src + 3 * row + dsr) + src + ss + f32 + row + src)
            continue
        k, members = ev[1], ev[2]
        n = N - k  # reads k..N-1 saw slot k
        if len(members) > 1:
            G = len(members)
            add("_src_group_bwd_kernel", G * (src + ss) + n * (src + 2 * row) + G * (f32 + row) + G * n * dsr)
            add("_src_bwd_kernel", src + ss + f32 + row + src)  # the newest member, completed at once
        else:
            add("_src_bwd_kernel", n * (src + 3 * row + dsr) + src + ss + src)
    return {k: (calls[k], out[k]) for k in V7_KERNELS}


def kernel_table(prof: dict, hbm_gbps: float) -> list[dict]:
    """For each MHAR target of a ``benchmarks/profile_step.py --json`` record (kind train or op, H = 8): per
    routing kernel the launches and CUDA ms per step the profiler measured, beside ``kernel_bytes``: GB, achieved
    GB/s, fraction of ``hbm_gbps`` and the ms at that bandwidth."""
    est = kernel_bytes(prof["size"])
    rows = []
    for target, res in prof["results"].items():
        if not target.startswith(("mhar", "fused")):
            continue
        for kern, (calls, nbytes) in est.items():
            ms, seen = res["kernels"].get(kern, [0.0, 0])
            rows.append(dict(size=prof["size"], target=target, kernel=kern, calls=seen, model_calls=calls, ms=ms,
                             gb=nbytes / 1e9, gbps=nbytes / ms / 1e6 if ms else None,
                             of_hbm=nbytes / ms / 1e6 / hbm_gbps if ms else None,
                             ms_at_hbm=nbytes / (hbm_gbps * 1e9) * 1e3))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--training", default="results/bench/training.csv", help="bench_training.py CSV")
    ap.add_argument("--op", default="results/bench/routing_op.csv", help="bench_routing_op.py CSV (hbm_gbps)")
    ap.add_argument("--hbm-gbps", type=float, help="HBM bandwidth in GB/s (default: from --op)")
    ap.add_argument("--out", default="results/bench/traffic_bound.csv")
    ap.add_argument("--profile", help="a profile_step.py --json record: print its routing kernels' bytes and "
                    "fraction of the HBM bandwidth instead (writes nothing)")
    args = ap.parse_args(argv)
    if args.profile:
        return _print_profile(args)
    for p in [args.training] + ([] if args.hbm_gbps else [args.op]):
        if not Path(p).is_file():
            print(f"error: {p} not found (run the GPU benchmarks first: benchmarks/gpu_session.sh)", file=sys.stderr)
            return 2
    training = list(csv.DictReader(open(args.training, newline="")))
    hbm = args.hbm_gbps or float(next(csv.DictReader(open(args.op, newline="")))["hbm_gbps"])
    rows = bound_rows(training, hbm)
    if not rows:
        print(f"error: {args.training} has no baseline rows at 100M / 350M / 1B", file=sys.stderr)
        return 2
    inputs = args.training if args.hbm_gbps else f"{args.training} {args.op}"
    prov = {"git_commit": git_info()["commit"], "command": command_line("benchmarks.traffic_bound", argv),
            "inputs": inputs}
    write_csv(args.out, [{**r, **prov} for r in rows])
    for r in rows:
        print(f"{r['size']:>5}: {r['reads']} reads, unit {r['unit_gb']} GB; bytes v5 {r['v5_gb']} GB / v6 "
              f"{r['v6_gb']} GB ({r['v5_gb'] / r['v6_gb']:.2f}x fewer) / v6 with forward groups of {V6_GROUP} "
              f"{r[f'v6_g{V6_GROUP}_gb']} GB ({r['v5_gb'] / r[f'v6_g{V6_GROUP}_gb']:.2f}x); bound "
              f"{r['v5_bound_ratio']:.3f} (v5) / {r['v6_bound_ratio']:.3f} (v6) / "
              f"{r[f'v6_g{V6_GROUP}_bound_ratio']:.3f} (v6 g{V6_GROUP}) / "
              f"{r[f'v6_sg{SOURCE_GROUP}_bound_ratio']:.3f} (v6 sg{SOURCE_GROUP}) / "
              f"{r[f'v6_g{V6_GROUP}_sg{SOURCE_GROUP}_bound_ratio']:.3f} (both) / "
              f"{r[f'v7_g{V7_GROUP}_bound_ratio']:.3f} (v7 g{V7_GROUP}) / {r['min_bound_ratio']:.3f} "
              f"(one-pass write-once); measured "
              f"{r['measured_ratio']} (gap {r['measured_gap_ms']} ms vs {r['v5_ideal_ms']} ms v5 ideal)")
    return 0


def _print_profile(args) -> int:
    for p in [args.profile] + ([] if args.hbm_gbps else [args.op]):
        if not Path(p).is_file():
            print(f"error: {p} not found (benchmarks/profile_step.py --json writes the profile; --hbm-gbps or --op "
                  "gives the bandwidth)", file=sys.stderr)
            return 2
    hbm = args.hbm_gbps or float(next(csv.DictReader(open(args.op, newline="")))["hbm_gbps"])
    try:
        rows = kernel_table(json.load(open(args.profile)), hbm)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"error: {args.profile} is not a profile_step.py --json record ({e!r})", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: {args.profile} has no MHAR target", file=sys.stderr)
        return 2
    print(f"routing kernels per step, bytes from kernel_bytes, at {hbm:.0f} GB/s ({args.profile})")
    for target in dict.fromkeys(r["target"] for r in rows):
        sub = [r for r in rows if r["target"] == target]
        print(f"{sub[0]['size']} {target}\n  {'kernel':24s} {'calls':>6s} {'ms':>7s} {'GB':>7s} {'GB/s':>7s} "
              f"{'of HBM':>7s} {'ms at HBM':>9s}")
        ms, gb = sum(r["ms"] for r in sub), sum(r["gb"] for r in sub)
        for r in sub + [dict(kernel="all of these", calls=sum(r["calls"] for r in sub), ms=ms, gb=gb,
                             gbps=gb / ms * 1e3 if ms else None, of_hbm=gb / ms * 1e3 / hbm if ms else None,
                             ms_at_hbm=sum(r["ms_at_hbm"] for r in sub))]:
            print(f"  {r['kernel']:24s} {r['calls']:6.0f} {r['ms']:7.3f} {r['gb']:7.3f} {r['gbps'] or 0:7.0f} "
                  f"{r['of_hbm'] or 0:7.2f} {r['ms_at_hbm']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
