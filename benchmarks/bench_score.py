"""Time the v7 scoring kernels alone: every ``score_sources`` call of one microbatch's forward, per kernel.

In a forward of a model of L blocks (N = 2L + 1 sources and K = 2L + 1 announced reads, H heads), source j is
scored once for reads j..K-1, as ``FusedRouter`` does. This script makes those N calls with each scoring kernel
(``_kernels.SCORE_KERNEL``: ``heads``, one program per (token block, head), and ``rows``, one program per
(token block, chunk of reads) for all heads, whole-sector stores) and, for ``rows``, the launch
configurations given with ``--rows-launch`` (tokens x reads x warps; the library's ``score_rows_launch``
replaced for that measurement). Timing: median CUDA-graph replay of the N calls (``bench_routing_op.graph_ms``).
Every table is compared with the ``heads`` kernel's (max relative difference). Bytes: the sources read once and
the table written once (what any scoring kernel must move), and the bandwidth that achieves.

    PYTHONPATH=. python -m benchmarks.bench_score --sizes 100M 350M 1B --rows-launch 32x32x8 32x32x4 64x16x8

One JSON line per (size, kernel, launch) on stdout.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

from benchmarks.bench_routing_op import MICROBATCH, graph_ms
from mhar.config import PRESETS


def _case(size: str, H: int, seed: int = 0):
    p = PRESETS[size]
    B, T = MICROBATCH[size]
    N = K = 2 * p["n_layers"] + 1
    D = p["d_model"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    buf = torch.randn(N, B * T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    ss = buf.float().pow(2).sum(-1).contiguous()
    W = (0.1 * torch.randn(K, D, device="cuda", generator=g)).contiguous()
    S = torch.zeros(N, K, B * T, H, device="cuda", dtype=torch.float32)
    return dict(size=size, B=B, T=T, D=D, H=H, N=N, K=K, buf=buf, ss=ss, W=W, S=S)


def _score_all(K_mod, c: dict, W_split) -> None:
    for j in range(c["N"]):
        K_mod.score_sources(c["buf"], c["ss"], c["W"], c["S"], j, j, c["H"], 1e-6, W_split)


def run(size: str, H: int, rows_launches: list[tuple[int, int, int]]) -> list[dict]:
    from mhar.routing import _kernels as K
    c = _case(size, H)
    W_split = K.split_weights(c["W"], c["buf"].dtype)
    BT, D, N, Kr = c["B"] * c["T"], c["D"], c["N"], c["K"]
    must = N * BT * D * 2 + sum(Kr - j for j in range(N)) * BT * H * 4  # sources read + table written
    rows, ref = [], None
    saved = K.SCORE_KERNEL, K.score_rows_launch
    try:
        for kernel, launch in [("heads", None), ("rows", None)] + [("rows", rl) for rl in rows_launches]:
            K.SCORE_KERNEL = kernel
            K.score_rows_launch = saved[1] if launch is None else (lambda KP, HP, dot=True, _l=launch: _l)
            c["S"].zero_()
            ms = graph_ms(lambda: _score_all(K, c, W_split))
            table = c["S"].clone()
            if ref is None:
                ref, diff = table, 0.0
            else:
                diff = ((table - ref).abs().max() / ref.abs().max()).item()
            used = (saved[1](max(16, triton.next_power_of_2(Kr)), triton.next_power_of_2(H)) if kernel == "rows"
                    and launch is None else launch)  # (the first source's launch: all K reads)
            row = dict(size=size, H=H, BT=BT, D=D, sources=N, reads=Kr, kernel=kernel,
                       rows_launch="x".join(map(str, used)) if used else "", ms=round(ms, 4),
                       us_per_call=round(ms * 1e3 / N, 2), must_gb=round(must / 1e9, 4),
                       gbps=round(must / (ms * 1e-3) / 1e9, 1), max_rel_diff_vs_heads=diff)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        K.SCORE_KERNEL, K.score_rows_launch = saved
    return rows


def _launch_arg(s: str) -> tuple[int, int, int]:
    try:
        bt, kc, w = (int(v) for v in s.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give tokens x reads x warps, e.g. 32x32x8") from None
    if min(bt, kc) < 16 or w not in (1, 2, 4, 8, 16) or bt & (bt - 1) or kc & (kc - 1):
        raise argparse.ArgumentTypeError(f"{s!r}: tokens and reads powers of two >= 16, warps a power of two")
    return bt, kc, w


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"], choices=["100M", "350M", "1B"])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rows-launch", nargs="*", type=_launch_arg, default=[],
                    help="extra tokens x reads x warps launches of the rows kernel, e.g. 32x32x4 64x16x8")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: bench_score times CUDA kernels; run it on a GPU machine")
    for size in args.sizes:
        run(size, args.heads, args.rows_launch)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
