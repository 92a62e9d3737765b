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
