"""Per-kernel HBM bytes of the fused_v7_sg8 routing at one preset (the paper's microbatch, bf16 sources), from
each kernel's loads and stores as written in mhar/routing/_kernels.py, beside the CUDA ms per microbatch that
benchmarks/profile_step.py measured (its --json): achieved GB/s and the fraction of the measured 4275 GB/s.

    PYTHONPATH=. python results/gpu/session_2026-12-02e/kernel_bytes.py results/gpu/session_2026-12-02e/call1_prof_train_1B.json

Counted: sources / douts / partials / outputs / score rows / lse / delta / sums of squares / dsr, each once per
kernel that touches it (L2 hits are not subtracted: a lower bound on time at full bandwidth, not a prediction).
Reads are k = 0..N-1 (N = 2L + 1), read k sees sources 0..k; forward groups of 4 reads (group g's first read
a = 4g: a prefix pass over its a + 1 sources writes 4 partials); source groups of 8 (mhar.routing.fused rule,
the same walk as bench_routing_op._dout_passes)."""
from __future__ import annotations

import json
import sys

from benchmarks.bench_routing_op import MICROBATCH
from mhar.config import PRESETS

HBM = 4275e9


def kernel_bytes(size: str, group: int = 4, source_group: int = 8, H: int = 8) -> dict:
    B, T = MICROBATCH[size]
    D, L = PRESETS[size]["d_model"], PRESETS[size]["n_layers"]
    N, BT = 2 * L + 1, B * T
    src = BT * D * 2          # a source, dout, output or partial in bf16
    f32 = BT * D * 4          # an fp32 partial gradient
    ss, row = BT * 4, BT * H * 4  # sums of squares; one read's scores / lse / delta of one source
    ns = [k + 1 for k in range(N)]
    out = dict.fromkeys(("_append_kernel", "_score_kernel", "_prefix7_kernel", "_fwd7_kernel", "_stash_kernel",
                         "_src_group_bwd_kernel", "_src_bwd_kernel"), 0)
    out["_append_kernel"] = N * (2 * src + ss)
    out["_score_kernel"] = N * (src + ss) + sum(N - j for j in range(N)) * row
    for a in range(0, N, group):
        K = min(group, N - a)
        if K > 1:  # prefix: its sources and their score rows for K reads (max, then mix), K partials + lse written
            out["_prefix7_kernel"] += ns[a] * src + 2 * K * ns[a] * row + K * (src + row)
        for i in range(a, a + K):
            newer = ns[i] - (ns[a] if K > 1 else 0)
            out["_fwd7_kernel"] += (src + row if K > 1 else 0) + newer * (src + 2 * row) + src + row
    out["_stash_kernel"] = N * (3 * src + row)
    # backward, newest read first: group passes and completions (mhar.routing.fused._source_group)
    first = {j: j for j in range(N)}
    partial = {}
    for k in range(N - 1, -1, -1):
        s_ = k  # read k's only new source
        if s_ in partial:  # completion over reads k .. k_end-1 of a group member: partial + cpart in, grad out
            k_end = partial.pop(s_)
            n = k_end - k
            out["_src_bwd_kernel"] += n * (src + 3 * row) + src + ss + f32 + row + src + n * row // 2
            continue
        grp = [s_]
        o = s_ - 1
        while len(grp) < source_group and o >= 0 and first[o] < k and o not in partial:
            grp.insert(0, o)
            o -= 1
        n = N - k  # later reads k .. N-1
        if len(grp) > 1:  # one pass: the group's sources, n douts (+ lse, delta), fp32 partials + cparts, dsr
            G = len(grp)
            out["_src_group_bwd_kernel"] += G * (src + ss) + n * (src + 2 * row) + G * (f32 + row) + G * n * row // 2
            for m in grp[:-1]:
                partial[m] = k
            # the newest member is completed at once (no reads): partial + cpart in, grad out
            out["_src_bwd_kernel"] += src + ss + f32 + row + src
        else:  # one source over its n reads: douts, lse, delta, scores; grad + dsr out
            out["_src_bwd_kernel"] += n * (src + 3 * row) + src + ss + src + n * row // 2
    return out


def main(path: str) -> None:
    prof = json.load(open(path))
    size = prof["size"]
    est = kernel_bytes(size)
    for target, res in prof["results"].items():
        if not target.startswith("mhar"):
            continue
        print(f"{size} {target} ({path})")
        print(f"  {'kernel':24s} {'calls':>6s} {'ms':>7s} {'GB':>7s} {'GB/s':>7s} {'of HBM':>7s} {'ms at HBM':>9s}")
        tot_ms = tot_b = 0.0
        for k, b in est.items():
            ms, calls = res["kernels"].get(k, [0.0, 0])
            tot_ms, tot_b = tot_ms + ms, tot_b + b
            print(f"  {k:24s} {calls:6.0f} {ms:7.3f} {b / 1e9:7.3f} {b / ms / 1e6 if ms else 0:7.0f} "
                  f"{b / ms / 1e6 / (HBM / 1e9) if ms else 0:7.2f} {b / HBM * 1e3:9.3f}")
        print(f"  {'all of these':24s} {'':6s} {tot_ms:7.3f} {tot_b / 1e9:7.3f} {tot_b / tot_ms / 1e6:7.0f} "
              f"{tot_b / tot_ms / 1e6 / (HBM / 1e9):7.2f} {tot_b / HBM * 1e3:9.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
