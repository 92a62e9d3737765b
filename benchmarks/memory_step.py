"""Where the peak memory of a training step goes: the live CUDA allocations at the peak, grouped by the
library code that made them (baseline vs a routed variant, the step users run without its CUDA graph).

    PYTHONPATH=. python -m benchmarks.memory_step 350M baseline mhar_fused [--graph]      # GPU

Builds ``benchmarks.bench_training.build_step`` (the library's ``mhar.training.step.TrainStep``: compiled pieces,
fused AdamW; ``--graph``: the whole step captured in a CUDA graph, as the trainer runs it on a GPU) with the
allocator's history recorded from before the model is built (``torch.cuda.memory._record_memory_history``),
runs the first steps (warm-up, capture, replays) and replays the trace's allocations and frees in order: the
moment of the largest live total is printed split by the innermost ``mhar/`` (else ``benchmarks/``, else any)
frame of each live block's allocation stack. Each variant runs in its own process.
"""
from __future__ import annotations

import subprocess
import sys
from collections import defaultdict


def _site(frames: list) -> str:
    """The innermost frame in the library (else the benchmark, else the first frame) as 'file:line func'."""
    for key in ("/mhar/", "/benchmarks/"):
        for f in frames:
            if key in f.get("filename", ""):
                name = f["filename"].split(key, 1)[1]
                return f"{key.strip('/')}/{name}:{f.get('line', '?')} {f.get('name', '')}"
    if frames:
        f = frames[0]
        return f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '')}"
    return "(no stack)"


def _replay(trace: list, before: int, stop: int | None = None):
    """After each alloc / free_requested event of ``trace[:stop]``: (index, live blocks {addr: (size, frames)},
    bytes from before the trace still live, live total). ``live`` is one dict, updated in place."""
    live: dict = {}
    pre = total = before
    for i, e in enumerate(trace[:stop]):
        act, addr = e.get("action"), e.get("addr")
        if act == "alloc":
            live[addr] = (e["size"], e.get("frames", []))
            total += e["size"]
        elif act == "free_requested":
            block = live.pop(addr, None)
            if block is not None:
                freed = block[0]
            else:  # a block allocated before the trace
                freed = min(e.get("size", 0), pre)
                pre -= freed
            total -= freed
        else:
            continue
        yield i, live, pre, total


def peak_breakdown(trace: list, before: int = 0) -> tuple[int, dict]:
    """Replay an allocator trace (``snapshot["device_traces"][device]``: dicts with ``action`` in
    {"alloc", "free_requested", "free_completed", ...}, ``addr``, ``size``, ``frames``) and return
    (peak bytes, {site: live bytes at the peak}). ``before`` bytes were live when the trace began (one
    entry, "(allocated before the step)"). A block counts from its "alloc" to its "free_requested" (its
    memory is the caching allocator's to reuse from then on); frees of blocks allocated before the trace are
    taken off ``before``. Two passes: find the peak event, then replay up to it."""
    peak, at = before, None
    for i, _, _, total in _replay(trace, before):
        if total > peak:
            peak, at = total, i
    if at is None:
        return peak, ({"(allocated before the step)": before} if before else {})
    for _, live, pre, _ in _replay(trace, before, at + 1):
        pass
    out: dict = defaultdict(int)
    for size, frames in live.values():
        out[_site(frames)] += size
    if pre:
        out["(allocated before the step)"] += pre
    return peak, dict(out)


def measure(size: str, variant: str, graph: bool = False, top: int = 14) -> dict:
    """One (size, variant) in this process: the allocator history is recorded from before the model is built,
    over the steps ``python -m mhar.train`` runs first (with ``graph``: the eager warm-up steps, the CUDA-graph
    capture and replays; else three steps), and the peak of the whole run is attributed. Returns
    {"peak", "sites", "max_allocated"} (bytes)."""
    import torch  # lazy: the parent only starts one process per variant (a fresh allocator); --one imports torch

    # lazy: the parent only starts one process per variant (a fresh allocator); --one imports torch
    from benchmarks.bench_training import build_step
    # lazy: the parent only starts one process per variant (a fresh allocator); --one imports torch
    from mhar.training.step import GRAPH_WARMUP

    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    step, batches, _ = build_step(size, variant, 8, "cuda", compile=True, graph=graph)
    for i in range(GRAPH_WARMUP + 3 if graph else 3):
        step(batches[i % len(batches)], 5e-4)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, sites = peak_breakdown(snap["device_traces"][torch.cuda.current_device()], before)
    gib = 2 ** 30
    mx = torch.cuda.max_memory_allocated()
    print(f"MEMORY {size} {variant}{' graph' if graph else ''}: max_memory_allocated {mx / gib:.3f} GiB "
          f"(trace replay peak {peak / gib:.3f} GiB), by allocation site at the peak:")
    for site, b in sorted(sites.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {b / gib:8.3f} GiB  {site}")
    return {"peak": peak, "sites": sites, "max_allocated": mx}


def main(argv=None) -> None:
    """``SIZE VARIANT... [--graph]``: each variant in its own process (a fresh allocator: nothing of an earlier
    variant stays allocated); ``--one`` runs one variant here."""
    args = list(argv if argv is not None else sys.argv[1:])
    graph = "--graph" in args
    args = [a for a in args if a != "--graph"]
    if args and args[0] == "--one":
        measure(args[1], args[2], graph=graph)
        return
    size, variants = args[0], args[1:] or ["baseline", "mhar_fused"]
    for v in variants:
        cmd = [sys.executable, "-m", "benchmarks.memory_step", "--one", size, v] + (["--graph"] if graph else [])
        subprocess.run(cmd, check=False)


if __name__ == "__main__":
    main()
