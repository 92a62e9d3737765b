"""Where the peak memory of a training step goes: the live CUDA allocations at the peak, grouped by the
library code that made them (baseline vs a routed variant, the step users run without its CUDA graph).

    PYTHONPATH=. python -m benchmarks.memory_step 350M baseline mhar_fused      # GPU

Builds ``benchmarks.bench_training.build_step`` (the library's ``mhar.step.TrainStep``: compiled pieces,
fused AdamW; no CUDA graph, so every allocation is visible), runs two warm-up steps, then records the
allocator's history (``torch.cuda.memory._record_memory_history``) over one step. From the trace it replays
allocations and frees in order, finds the moment of the largest live total and prints it split by the
innermost ``mhar/`` (else ``benchmarks/``, else any) frame of each live block's allocation stack; blocks alive
before the recorded step (parameters, optimizer state, buffers kept between steps) form one line.
"""
from __future__ import annotations

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


def peak_breakdown(trace: list, before: int = 0) -> tuple[int, dict]:
    """Replay an allocator trace (``snapshot["device_traces"][device]``: dicts with ``action`` in
    {"alloc", "free_requested", "free_completed", ...}, ``addr``, ``size``, ``frames``) and return
    (peak bytes, {site: live bytes at the peak}). ``before`` bytes were live when the trace began (one
    entry, "(allocated before the step)"). A block counts from its "alloc" to its "free_requested" (its
    memory is the caching allocator's to reuse from then on); frees of blocks allocated before the trace are
    taken off ``before``."""
    live: dict = {}
    total = peak = before
    pre = before
    at_peak: dict = {}
    for e in trace:
        act, addr = e.get("action"), e.get("addr")
        if act == "alloc":
            live[addr] = (e["size"], _site(e.get("frames", [])))
            total += e["size"]
        elif act == "free_requested":
            if addr in live:
                total -= live.pop(addr)[0]
            else:
                pre = max(pre - e.get("size", 0), 0)
                total -= e.get("size", 0)
        else:
            continue
        if total > peak:
            peak = total
            at_peak = {"snapshot": dict(live), "pre": pre}
    out: dict = defaultdict(int)
    if at_peak:
        for size, site in at_peak["snapshot"].values():
            out[site] += size
        if at_peak["pre"]:
            out["(allocated before the step)"] += at_peak["pre"]
    elif before:
        out["(allocated before the step)"] = before
    return peak, dict(out)


def measure(size: str, variant: str, top: int = 12) -> dict:
    import torch

    from benchmarks.bench_training import build_step

    step, batches, _ = build_step(size, variant, 8, "cuda", compile=True, graph=False)
    for b in batches[:2]:
        step(b, 5e-4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    step(batches[2], 5e-4)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    dev = torch.cuda.current_device()
    peak, sites = peak_breakdown(snap["device_traces"][dev], before)
    gib = 2 ** 30
    print(f"MEMORY {size} {variant}: peak {torch.cuda.max_memory_allocated() / gib:.3f} GiB "
          f"(trace replay {peak / gib:.3f} GiB), allocated before the step {before / gib:.3f} GiB")
    for site, b in sorted(sites.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {b / gib:8.3f} GiB  {site}")
    return {"peak": peak, "before": before, "sites": sites}


def main(argv=None) -> None:
    args = list(argv if argv is not None else sys.argv[1:])
    size, variants = args[0], args[1:] or ["baseline", "mhar_fused"]
    for v in variants:
        measure(size, v)


if __name__ == "__main__":
    main()
