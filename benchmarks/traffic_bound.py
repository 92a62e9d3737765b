"""The byte model of the fused routing, and the bound on MHAR's training-throughput ratio that it implies.

Per size (the paper's microbatch, bf16 sources of E = B*T*D elements) the routing reads of one microbatch see
n = 1, 2, ..., 2L+1 sources (each sublayer reads the embedding and every earlier sublayer output; the final read
sees all 2L+1; ``routing_reads``, checked against a real model in the tests). One byte "unit" = sum_n n * E * 2.

* ``fused_bytes``: what routing_impl ``fused`` moves per microbatch, forward and backward (its score table,
  forward groups of ``READ_GROUP`` reads, source groups of ``SOURCE_GROUP``; ``fused_config``: heads wider than
  ``SOURCE_GROUP_MAX_HEAD`` columns take one gradient pass per source). About 2 units: the forward reads each
  source about once per read; the source-major backward reads, per source, the douts of the reads that saw it,
  plus per-source O(N) terms (stash, the gradient written once, score rows, partial gradients of source groups).
* ``min_bytes``: any one-pass-per-read algorithm (forward reads the sources and writes the output; backward reads
  sources and dout and writes each source gradient once).
* ``kernel_bytes``: the same per kernel, counted independently from each kernel's loads and stores.
* ``two_phase_bytes`` / ``block_layout_bytes``: the two-phase algorithm (phase 1 reads the sources stored before a
  block of S reads once for all S; phase 2 merges each read's newer sources by online softmax) for MHAR by block
  size S, and for the block layouts; ``two_phase_rows`` tabulates bytes and bound (``--two-phase``).

At the measured HBM bandwidth that is ``ideal_ms``; with the measured baseline step the throughput ratio cannot
exceed base / (base + ideal), whatever the kernels. The measured ratio and step gap are printed beside it.

    PYTHONPATH=. python -m benchmarks.traffic_bound --training results/bench/training.csv \
        --op results/bench/routing_op.csv --out results/bench/traffic_bound.csv
    PYTHONPATH=. python -m benchmarks.traffic_bound --two-phase results/bench/two_phase_bound.csv  # by block size S
    PYTHONPATH=. python -m benchmarks.traffic_bound --profile PROFILE.json --hbm-gbps 4000   # per kernel, beside a
                                                                     # benchmarks/profile_step.py --json record
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Optional

from analysis.load.bench import bench_variant
from benchmarks.common import command_line, microbatch, write_csv
from mhar.model.presets import PRESETS
from mhar.model.residuals.open_attnres import layers_per_block
from mhar.model.routing.names import SOURCE_GROUP, SOURCE_GROUP_MAX_HEAD, READ_GROUP
from mhar.runs.provenance import git_info

BYTES_PER_ELT = 2  # bf16 sources under autocast


def routing_reads(n_layers: int) -> list[int]:
    """Sources seen by each routing read of one forward: 2L sublayer reads (1..2L), then the final read."""
    return list(range(1, 2 * n_layers + 2))


def unit_bytes(size: str) -> int:
    """One pass over the sources of every read of one microbatch (bytes)."""
    B, T = microbatch(size)
    cfg = PRESETS[size].model
    return sum(routing_reads(cfg["n_layers"])) * B * T * cfg["d_model"] * BYTES_PER_ELT


def min_bytes(ns: list[int], E: int, elt: int = BYTES_PER_ELT) -> tuple[int, int]:
    """(fwd, bwd) bytes of a one-pass-per-call algorithm for reads over ns sources, E = B*T*D."""
    fwd = sum((n + 1) * E * elt for n in ns)
    bwd = sum((2 * n + 1) * E * elt for n in ns)
    return fwd, bwd


def backward_passes(ns: list[int], source_group: int):
    """The source-gradient passes of the fused backward for reads over ns sources, in the order they run (the rule
    of ``mhar.model.routing.fused._source_group``: backward visits reads newest first; a read's newest new source starts
    a group with the older consecutive slots first seen by earlier reads and not yet in a group, up to
    ``source_group`` in all). Yields ``("pass", k, members)``: one pass over reads k..N-1 for the slots ``members``
    (one slot: the plain write-once pass; several: a group pass writing a partial gradient for every member, the
    newest completed at once with no reads, as its RMS term needs every head), and ``("complete", slot, k, k_end)``:
    a group member completed by its first reader k over reads k..k_end-1."""
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


def _dout_passes(ns: list[int], source_group: int) -> tuple[int, int]:
    """(douts read, partial gradients) of the fused backward for reads over ns sources when up to ``source_group``
    consecutive sources share one pass (``backward_passes``): a pass over reads k.. reads N - k douts, a completion
    k_end - k; a group pass writes a partial for each of its members."""
    douts = parts = 0
    for ev in backward_passes(ns, source_group):
        if ev[0] == "complete":
            douts += ev[3] - ev[2]
        else:
            douts += len(ns) - ev[1]
            parts += len(ev[2]) if len(ev[2]) > 1 else 0
    return douts, parts


def fused_config(H: int, D: int, null: bool = False) -> dict:
    """The ``fused_bytes`` options of what routing_impl ``fused`` runs for H heads of width D: the score table
    unless a null source broadcasts (mhar_delta), forward groups of READ_GROUP, source groups of SOURCE_GROUP up to
    SOURCE_GROUP_MAX_HEAD columns per head."""
    return dict(group=READ_GROUP, table=not null, source_group=SOURCE_GROUP if D // H <= SOURCE_GROUP_MAX_HEAD else 1)


def fused_bytes(ns: list[int], E: int, H: int, D: int, elt: int = BYTES_PER_ELT, group: int = 1,
                source_group: int = 1, table: bool = False) -> tuple[int, int]:
    """(fwd, bwd) bytes of the fused kernels for reads over ns sources (non-decreasing, each read the first to see
    its newest source), E = B*T*D elements per source; ``fused_config(H, D)`` gives routing_impl ``fused``'s options
    (the defaults here: no table, no groups). ``group`` > 1: forward prefix sharing (one pass over the first read's
    sources writes a partial per read, which each read reads back with its newer sources). Each source's sum of
    squares per token (fp32, written by the append) is read with the source by every read that scores it and once
    by its gradient kernel. ``source_group`` > 1: consecutive sources share one pass over the later reads' douts;
    each partial gradient costs an fp32 write and read and its completion pass reads the source again. ``table``:
    each source is read once more (with its sums of squares) to write its score rows for every read that sees it
    (fp32, H per token); the reads take their scores from the table (read twice: the max, then the mix) instead of
    the sums of squares, and the gradient kernel reads each (source, read) row once."""
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
            p = ns[a]
            # (without the table the prefix pass reads each prefix source's sums of squares too)
            fwd += (p + 2 * K + sum(ns[i] - p + 1 for i in range(a, a + K))) * E * elt + \
                sum(ns[i] - p for i in range(a, a + K)) * per_src + (K * p * 2 * sb if table else p * ss)
    # dL/dscore per (token, head, read, source), in the sources' dtype: written by the gradient kernel into one
    # (H, reads, sources x tokens) buffer, zeroed first and read whole (zeros too) by the single dW matmul
    dsr = sum(ns) * (E // D) * H * elt + 2 * N * N * (E // D) * H * elt
    # stash: read dout + out, write the dout slot (3); per source: read it in the kernel and in the dW matmul
    # (2), write its gradient (1)
    douts, parts = _dout_passes(ns, source_group)
    # a partial: fp32 written by the group pass and read by the completion pass, which reads the source again
    # (and its sums of squares); its RMS-term sums cpart (H fp32 per token) written and read
    bwd = douts * E * elt + dsr + 6 * N * E * elt + N * ss + parts * (5 * E * elt + ss + 2 * sb)
    if table:
        bwd += sum(ns) * sb
    return fwd, bwd


FUSED_VARIANTS = ("mhar_fused", "mhar_auto")  # bench_training's variants that run the fused kernels on a GPU


def bound_rows(training: list[dict], hbm_gbps: float, fused: tuple = FUSED_VARIANTS, heads: int = 8) -> list[dict]:
    """Per size with a baseline step row in ``training`` (bench_training.py rows): the bytes, ideal time at
    ``hbm_gbps`` and throughput bound of ``fused`` and ``min``, and the measured ratio of the first variant of
    ``fused`` that the record holds at that size (an older record's variant names read as the current ones:
    ``analysis.load.bench.bench_variant``)."""
    fused = (fused,) if isinstance(fused, str) else tuple(fused)
    training = [r for r in training if r.get("mode", "step") != "trainer"]  # the step rows (same step, one each)
    rows = []
    for size in ("100M", "350M", "1B"):
        base = next((r for r in training if r["size"] == size and r["variant"] == "baseline"
                     and r.get("status", "ok") == "ok"), None)
        if base is None:
            continue
        cfg, (B, T) = PRESETS[size].model, microbatch(size)
        ns, E = routing_reads(cfg["n_layers"]), B * T * cfg["d_model"]
        base_ms = float(base["step_ms"])
        row = dict(size=size, reads=len(ns), heads=heads, unit_gb=round(unit_bytes(size) / 1e9, 3),
                   hbm_gbps=hbm_gbps, base_ms=base_ms)
        row.update({k: base.get(k, "") for k in ("gpu", "driver", "torch", "triton")})  # of the measurements used
        for name, (f, b) in (("fused", fused_bytes(ns, E, heads, cfg["d_model"],
                                                   **fused_config(heads, cfg["d_model"]))),
                             ("min", min_bytes(ns, E))):
            ideal = (f + b) / (hbm_gbps * 1e9) * 1e3
            row[f"{name}_gb"] = round((f + b) / 1e9, 3)
            row[f"{name}_ideal_ms"] = round(ideal, 2)
            row[f"{name}_bound_ratio"] = round(base_ms / (base_ms + ideal), 4)
        run = next((r for v in fused for r in training if r["size"] == size
                    and bench_variant(r["variant"], r.get("routing_resolved")) == v
                    and r.get("status", "ok") == "ok"), None)
        row["measured_variant"] = run["variant"] if run else None
        row["measured_ratio"] = round(base_ms / float(run["step_ms"]), 4) if run else None
        row["measured_gap_ms"] = round(float(run["step_ms"]) - base_ms, 2) if run else None
        rows.append(row)
    return rows


# The two-phase algorithm (Kimi's Attention Residuals, arXiv:2603.15031, section 4) for MHAR: the pseudo-queries are
# parameters, so the reads are cut into blocks of S consecutive reads; phase 1 reads the sources stored before a
# block ONCE for all S reads (S pseudo-queries, a running max and sum of exponentials per read and head) and writes
# S partial mixes; phase 2 runs each read in order over its partial and the block's own newer sources, merged by
# online softmax (exact). No score table: phase 1 scores on the fly. The backward is the source-major one
# (``fused_bytes``'s), whose block is the source group. Block layouts (Block AttnRes, the released open_attnres
# block mode) read a few stored block states plus one transient source (the open block's partial sum / the stream).
BLOCK_SIZES = (1, 2, 4, 8, 12, 16, 24, 32)


def two_phase_fwd_bytes(ns: list[int], E: int, D: int, S: int, elt: int = BYTES_PER_ELT) -> int:
    """Forward bytes of the two-phase algorithm at block size S for reads over ns sources, E = B*T*D elements per
    source, counted block by block: the appends write each source's sum of squares (fp32 per token); a block of
    K > 1 reads: phase 1 reads its first read's ns[a] sources (each with its sums of squares) and writes K
    partials; phase 2: read i reads its partial and its ns[i] - ns[a] newer sources (with sums of squares) and
    writes its output. A block of one read is one pass (its sources in, its output out). (The log-sum-exps, H
    fp32 per token and read, are left out.)"""
    ss = (E // D) * 4
    total = len(ns) * ss
    for a in range(0, len(ns), S):
        blk = ns[a:a + S]
        if len(blk) == 1:
            total += (blk[0] + 1) * E * elt + blk[0] * ss
            continue
        total += blk[0] * (E * elt + ss) + len(blk) * E * elt  # phase 1
        total += sum(E * elt + (n - blk[0]) * (E * elt + ss) + E * elt for n in blk)  # phase 2
    return total


def two_phase_bytes(ns: list[int], E: int, H: int, D: int, S: int, source_group: Optional[int] = None,
                    elt: int = BYTES_PER_ELT) -> tuple[int, int]:
    """(fwd, bwd) bytes of the two-phase algorithm at block size S: ``two_phase_fwd_bytes`` and the source-major
    backward of ``fused_bytes`` (no table; source groups of ``source_group``, default what ``fused_config`` gives
    for H heads of width D / H)."""
    sg = fused_config(H, D)["source_group"] if source_group is None else source_group
    return two_phase_fwd_bytes(ns, E, D, S, elt), fused_bytes(ns, E, H, D, elt, source_group=sg)[1]


def block_layout_reads(n_layers: int, blocks: int, layout: str) -> list[tuple[int, int]]:
    """(stored sources, transient sources) of each read of one forward of a block layout. ``block_attnres``
    (``mhar.model.residuals.block``): 2L sublayers in ``blocks`` blocks; a sublayer reads the embedding and the
    completed block sums, plus the open block's partial sum once the block has an output; the final read sees
    every block sum. ``open_attnres`` (block mode, ``mhar.model.residuals.open_attnres``): a sublayer reads the
    closed states (the embedding, then the stream after every P-th layer) and the stream itself; no final read."""
    S2 = 2 * n_layers
    if layout == "block_attnres":
        block_of = [i * blocks // S2 for i in range(S2)]
        reads = [(1 + block_of[i], int(i > 0 and block_of[i - 1] == block_of[i])) for i in range(S2)]
        return reads + [(1 + blocks, 0)]
    if layout == "open_attnres":
        P = layers_per_block(n_layers, blocks)
        closed = [1 + sum(1 for l in range(i // 2) if (l + 1) % P == 0) for i in range(S2)]
        return [(c, 1) for c in closed]
    raise ValueError(f"unknown block layout {layout!r}; choose block_attnres or open_attnres")


def block_layout_bytes(reads: list[tuple[int, int]], E: int, two_phase: bool,
                       elt: int = BYTES_PER_ELT) -> tuple[int, int]:
    """(fwd, bwd) bytes of a block layout's reads. Per read (``two_phase`` False, one pass per read): forward
    reads its stored and transient sources and writes the output; backward reads them and the dout and writes
    each one's gradient. Two-phase (phase-1 blocks = the runs of consecutive reads over the same stored
    sources): forward, phase 1 reads the run's stored sources once and writes a partial per read, phase 2 reads
    the partial and the transient source and writes the output; backward, phase 2 reads each read's dout, output,
    partial and transient source and writes the transient's gradient (the partial's is dout scaled per head),
    phase 1 reads every dout once more and every stored source once and writes its gradient once (all stored
    sources of a layout, at most blocks + 1, in one source-major pass)."""
    if not two_phase:
        fwd = sum((s + x + 1) * E * elt for s, x in reads)
        return fwd, sum((2 * (s + x) + 1) * E * elt for s, x in reads)
    runs: list[list] = []
    for s, x in reads:
        if runs and runs[-1][0] == s:
            runs[-1][1].append(x)
        else:
            runs.append([s, [x]])
    fwd = bwd = 0
    for s, xs in runs:
        K = len(xs)
        fwd += s * E * elt + (K * E * elt if K > 1 else 0)  # phase 1 (a run of one read: no partial)
        fwd += sum(((1 if K > 1 else 0) + x + 1) * E * elt for x in xs)  # phase 2
        bwd += sum((3 + (1 if K > 1 else 0) + 2 * x) * E * elt for x in xs)  # douts, outputs, partials, transients
    n_stored = max(s for s, _ in reads)
    bwd += len(reads) * E * elt + 2 * n_stored * E * elt  # phase 1: douts once, stored sources in, gradients out
    return fwd, bwd


def two_phase_rows(base_ms: dict, hbm_gbps: float, heads: int = 8, sizes=("100M", "350M", "1B"),
                   block_sizes=BLOCK_SIZES, blocks: int = 8) -> list[dict]:
    """Bytes per step (one microbatch, forward and backward) and the step-ratio bound base / (base + bytes / HBM)
    by block size S for MHAR's two-phase algorithm (layout ``mhar``) beside today's ``fused``, and for the block
    layouts (``block_attnres`` / ``open_attnres`` at ``blocks`` blocks, per read and two-phase; S = the reads
    of a phase-1 block, ``layer`` for the layout's own blocks). ``base_ms``: the baseline step per size."""
    rows = []

    def row(size, layout, algo, S, fb):
        f, b = fb
        ideal = (f + b) / (hbm_gbps * 1e9) * 1e3
        rows.append(dict(size=size, layout=layout, algorithm=algo, S=S, heads=heads if layout == "mhar" else 1,
                         fwd_gb=round(f / 1e9, 3), bwd_gb=round(b / 1e9, 3), gb=round((f + b) / 1e9, 3),
                         hbm_gbps=hbm_gbps, base_ms=base_ms[size], ideal_ms=round(ideal, 3),
                         bound_ratio=round(base_ms[size] / (base_ms[size] + ideal), 4)))

    for size in sizes:
        if size not in base_ms:
            continue
        cfg, (B, T) = PRESETS[size].model, microbatch(size)
        L, D = cfg["n_layers"], cfg["d_model"]
        ns, E = routing_reads(L), B * T * D
        row(size, "mhar", "fused", READ_GROUP, fused_bytes(ns, E, heads, D, **fused_config(heads, D)))
        for S in block_sizes:
            row(size, "mhar", "two_phase", S, two_phase_bytes(ns, E, heads, D, S))
        for layout in ("block_attnres", "open_attnres"):
            reads = block_layout_reads(L, blocks, layout)
            row(size, layout, "per_read", 1, block_layout_bytes(reads, E, False))
            row(size, layout, "two_phase", "layer", block_layout_bytes(reads, E, True))
    return rows


def best_block_size(rows: list[dict]) -> dict:
    """Per size, the MHAR two-phase block size with the fewest bytes per step (the highest bound)."""
    best = {}
    for r in rows:
        if r["layout"] == "mhar" and r["algorithm"] == "two_phase":
            if r["size"] not in best or r["gb"] < best[r["size"]]["gb"]:
                best[r["size"]] = r
    return {size: r["S"] for size, r in best.items()}


# The kernels of routing_impl fused (score table, forward groups, source groups) in ``kernel_bytes``.
FUSED_KERNELS = ("_append_kernel", "_score_kernel", "_prefix_fwd_table_kernel", "_route_fwd_table_kernel",
                 "_stash_kernel",
                 "_src_group_bwd_kernel", "_src_bwd_kernel")


def kernel_bytes(size: str, heads: int = 8, group: int = READ_GROUP, source_group: int = SOURCE_GROUP) -> dict:
    """Per routing kernel of ``fused`` at a preset (the paper's microbatch, bf16 sources): (launches, HBM bytes)
    per microbatch, each load and store of the kernel (``mhar/model/routing/_kernels.py``) counted once: L2 hits are not
    subtracted, so bytes / bandwidth is a lower bound on the kernel's time. Read k (k = 0..N-1, N = 2L+1) sees
    sources 0..k. Forward: every append copies its source and writes its sums of squares; every source is scored
    once for the reads from its first reader on (H fp32 per token and read); a group of ``group`` reads makes one
    prefix pass over its first read's sources (their score rows twice: the max, then the mix) writing a partial
    and lse per read, and each read then mixes its newer sources into its partial. Backward, newest read first
    (``backward_passes``): each read stashes its dout; a read's new source either completes a group member (its
    douts, lse, delta and score rows for the reads since its first reader, the fp32 partial and its RMS sums in,
    the gradient and dsr out) or starts a group pass over up to ``source_group`` consecutive sources and every
    later read's dout (fp32 partials and RMS sums out, dsr out; the newest member completed at once), or, alone,
    one pass over its later reads. Not counted: the dsr buffer's zero fill and the one dW matmul (``dW_all``),
    which the aggregate model (``fused_bytes``) includes, and the append's copy, which it leaves out; the totals
    agree within 2% (``tests/benchmarks/test_traffic_bound.py``)."""
    B, T = microbatch(size)
    D, L = PRESETS[size].model["d_model"], PRESETS[size].model["n_layers"]
    N, BT, H = 2 * L + 1, B * T, heads
    src, f32 = BT * D * BYTES_PER_ELT, BT * D * 4  # a source / dout / output / partial; an fp32 gradient partial
    ss, row = BT * 4, BT * H * 4  # one source's sums of squares; one (source, read) score / lse / delta row
    dsr = BT * H * BYTES_PER_ELT  # one (source, read) dsr row (the sources' dtype)
    calls = dict.fromkeys(FUSED_KERNELS, 0)
    out = dict.fromkeys(FUSED_KERNELS, 0)

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
            add("_prefix_fwd_table_kernel", (a + 1) * (src + 2 * K * row) + K * (src + row))
        for i in range(a, a + K):
            newer = i - a if K > 1 else i + 1  # sources past the prefix
            add("_route_fwd_table_kernel", (src + row if K > 1 else 0) + newer * (src + 2 * row) + src + row)
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
    return {k: (calls[k], out[k]) for k in FUSED_KERNELS}


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
    ap.add_argument("--two-phase", metavar="CSV", help="write the two-phase algorithm's bytes and bound by block "
                    "size S (MHAR and the block layouts; two_phase_rows) to CSV instead")
    args = ap.parse_args(argv)
    if args.profile:
        return _print_profile(args)
    for p in [args.training] + ([] if args.hbm_gbps else [args.op]):
        if not Path(p).is_file():
            print(f"error: {p} not found (run the GPU benchmarks first: benchmarks/gpu_session.sh)", file=sys.stderr)
            return 2
    training = list(csv.DictReader(open(args.training, newline="")))
    hbm = args.hbm_gbps or float(next(csv.DictReader(open(args.op, newline="")))["hbm_gbps"])
    if args.two_phase:
        return _write_two_phase(args, argv, training, hbm)
    rows = bound_rows(training, hbm)
    if not rows:
        print(f"error: {args.training} has no baseline rows at 100M / 350M / 1B", file=sys.stderr)
        return 2
    inputs = args.training if args.hbm_gbps else f"{args.training} {args.op}"
    prov = {"git_commit": git_info()["commit"], "command": command_line("benchmarks.traffic_bound", argv),
            "inputs": inputs}
    write_csv(args.out, [{**r, **prov} for r in rows])
    for r in rows:
        print(f"{r['size']:>5}: {r['reads']} reads, unit {r['unit_gb']} GB; fused moves {r['fused_gb']} GB "
              f"(ideal {r['fused_ideal_ms']} ms, bound {r['fused_bound_ratio']:.3f}), one pass per read "
              f"{r['min_gb']} GB (bound {r['min_bound_ratio']:.3f}); measured {r['measured_ratio']} "
              f"({r['measured_variant']}, gap {r['measured_gap_ms']} ms)")
    return 0


def _write_two_phase(args, argv, training: list[dict], hbm: float) -> int:
    base = {}  # size -> the first baseline step row (its step time, and the hardware it was measured on)
    for r in training:
        if r["variant"] == "baseline" and r.get("mode", "step") != "trainer" and r.get("status", "ok") == "ok":
            base.setdefault(r["size"], r)
    rows = [{**r, **{k: base[r["size"]].get(k, "") for k in ("gpu", "driver", "torch", "triton")}}
            for r in two_phase_rows({k: float(v["step_ms"]) for k, v in base.items()}, hbm)]
    if not rows:
        print(f"error: {args.training} has no baseline rows at 100M / 350M / 1B", file=sys.stderr)
        return 2
    prov = {"git_commit": git_info()["commit"], "command": command_line("benchmarks.traffic_bound", argv),
            "inputs": args.training if args.hbm_gbps else f"{args.training} {args.op}"}
    write_csv(args.two_phase, [{**r, **prov} for r in rows])
    best = best_block_size(rows)
    print(f"bytes per step (GB, fwd + bwd) and step-ratio bound at {hbm:.0f} GB/s; fewest bytes: S = {best}")
    for r in rows:
        print(f"{r['size']:>5} {r['layout']:>13} {r['algorithm']:>9} S={r['S']!s:>5}: {r['fwd_gb']:6.2f} + "
              f"{r['bwd_gb']:6.2f} = {r['gb']:6.2f} GB, {r['ideal_ms']:5.2f} ms, bound {r['bound_ratio']:.4f}")
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
