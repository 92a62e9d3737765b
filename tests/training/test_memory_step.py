"""The peak attribution of benchmarks/memory_step.py on allocator traces of known shape (the GPU run itself
needs CUDA: `python -m benchmarks.memory_step SIZE VARIANTS`)."""
from __future__ import annotations

from benchmarks.memory_step import peak_breakdown


def _fr(path: str, line: int, name: str) -> list:
    return [{"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"},
            {"filename": path, "line": line, "name": name}]


def _alloc(addr, size, frames):
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames}


def _free(addr, size):
    return [{"action": "free_requested", "addr": addr, "size": size},
            {"action": "free_completed", "addr": addr, "size": size}]


def test_peak_is_the_largest_live_total_split_by_library_frame():
    attn = _fr("/repo/mhar/model/transformer.py", 180, "forward")
    route = _fr("/repo/mhar/model/routing/fused.py", 200, "forward")
    trace = [_alloc(1, 100, attn), _alloc(2, 50, route), *_free(1, 100),  # 150 live, then 50
             _alloc(3, 120, route), _alloc(4, 10, attn),  # 180 live: the peak
             *_free(3, 120), _alloc(5, 60, attn)]  # 120 afterwards
    peak, sites = peak_breakdown(trace, before=1000)
    assert peak == 1000 + 180
    assert sites == {"mhar/model/routing/fused.py:200 forward": 170, "mhar/model/transformer.py:180 forward": 10,
                     "(allocated before the step)": 1000}
    assert sum(sites.values()) == peak


def test_frees_of_blocks_from_before_the_trace_lower_the_base():
    """A gradient buffer kept from the previous step and freed early: the later peak is measured without it."""
    opt = _fr("/repo/mhar/training/step.py", 237, "__call__")
    trace = [*_free(99, 400), _alloc(1, 300, opt), _alloc(2, 200, opt)]
    peak, sites = peak_breakdown(trace, before=1000)
    assert peak == 1000 - 400 + 500 == 1100
    assert sites == {"mhar/training/step.py:237 __call__": 500, "(allocated before the step)": 600}


def test_no_allocation_in_the_trace_leaves_the_base():
    peak, sites = peak_breakdown([{"action": "segment_alloc", "addr": 0, "size": 10}], before=64)
    assert peak == 64 and sites == {"(allocated before the step)": 64}
