"""Time the v7 scoring kernel alone: every ``score_sources`` call of one microbatch's forward.

In a forward of a model of L blocks (N = 2L + 1 sources and K = 2L + 1 announced reads, H heads), source j is
scored once for reads j..K-1, as ``FusedRouter`` does. This script makes those N calls with the library's
launch (``_kernels.score_launch``) and with the launches given by ``--launch`` (tokens x warps per program;
``score_launch`` replaced for that measurement, the kernel unchanged), then with each kernel of ``--kernels``
other than ``head`` (``heads``: ``_score_heads_kernel``, autotuned as the library tunes it). Timing: median CUDA-graph replay of the N
calls (``bench_routing_op.graph_ms``). Every table is compared with the library launch's (max relative
difference). Bytes: the sources read once and the table written once (what any scoring kernel must move),
and the bandwidth that achieves.

    PYTHONPATH=. python -m benchmarks.bench_score --sizes 100M 350M 1B --launch 16x4 64x4 --kernels head heads

One JSON line per (size, launch) on stdout.
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks.bench_routing_op import MICROBATCH, graph_ms
from mhar.config import PRESETS


def _case(size: str, H: int, seed: int = 0, device: str = "cuda"):
    p = PRESETS[size]
    B, T = MICROBATCH[size]
    N = K = 2 * p["n_layers"] + 1
    D = p["d_model"]
    g = torch.Generator(device=device).manual_seed(seed)
    buf = torch.randn(N, B * T, D, device=device, dtype=torch.bfloat16, generator=g)
    ss = buf.float().pow(2).sum(-1).contiguous()
    W = (0.1 * torch.randn(K, D, device=device, generator=g)).contiguous()
    S = torch.zeros(N, K, B * T, H, device=device, dtype=torch.float32)
    return dict(size=size, B=B, T=T, D=D, H=H, N=N, K=K, buf=buf, ss=ss, W=W, S=S)


def run(size: str, H: int, launches: list[tuple[int, int]], kernels: tuple = ("head",)) -> list[dict]:
    from mhar.routing import _kernels as K
    c = _case(size, H)
    W_split = K.split_weights(c["W"], c["buf"].dtype)
    BT, D, N, Kr = c["B"] * c["T"], c["D"], c["N"], c["K"]
    must = N * BT * D * 2 + sum(Kr - j for j in range(N)) * BT * H * 4  # sources read + table written

    def score_all(kernel):
        for j in range(N):
            K.score_sources(c["buf"], c["ss"], c["W"], c["S"], j, j, H, 1e-6, W_split, kernel=kernel)

    rows, ref = [], None
    library = K.score_launch
    cases = [("head", None), *(("head", launch) for launch in launches), *((k, None) for k in kernels if k != "head")]
    try:
        for kernel, launch in cases:
            K.score_launch = library if launch is None else (lambda KP, dot=True, _l=launch: _l)
            c["S"].zero_()
            ms = graph_ms(lambda _k=kernel: score_all(_k))
            table = c["S"].clone()
            diff = 0.0 if ref is None else ((table - ref).abs().max() / ref.abs().max()).item()
            ref = table if ref is None else ref
            row = dict(size=size, H=H, BT=BT, D=D, sources=N, reads=Kr, kernel=kernel,
                       launch="library" if launch is None else "x".join(map(str, launch)), ms=round(ms, 4),
                       us_per_call=round(ms * 1e3 / N, 2), must_gb=round(must / 1e9, 4),
                       gbps=round(must / (ms * 1e-3) / 1e9, 1), max_rel_diff_vs_library=diff)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        K.score_launch = library
    return rows


def _launch_arg(s: str) -> tuple[int, int]:
    try:
        bt, w = (int(v) for v in s.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give tokens x warps, e.g. 32x4") from None
    if bt < 16 or bt & (bt - 1) or w not in (1, 2, 4, 8, 16):
        raise argparse.ArgumentTypeError(f"{s!r}: tokens a power of two >= 16, warps a power of two <= 16")
    return bt, w


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"], choices=["100M", "350M", "1B"])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--launch", nargs="*", type=_launch_arg, default=[],
                    help="extra tokens x warps launches of the scoring kernel, e.g. 16x4 64x4")
    ap.add_argument("--kernels", nargs="+", default=["head"], choices=["head", "heads"],
                    help="scoring kernels to time (the library's launch of each; --launch applies to head)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: bench_score times CUDA kernels; run it on a GPU machine")
    for size in args.sizes:
        run(size, args.heads, args.launch, tuple(args.kernels))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
