"""benchmarks/bench_score.py on CPU: its launch argument is checked, and it refuses to run without a GPU
with one ``error:`` line (the timings themselves need CUDA: results/gpu/)."""
from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import bench_score


def test_launch_argument_parsed_and_checked():
    assert bench_score._launch_arg("32x8") == (32, 8)
    for bad in ("32x16x8", "8x4", "24x4", "32x3", "axb"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_score._launch_arg(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_refuses_without_gpu():
    with pytest.raises(SystemExit, match="^error: bench_score times CUDA kernels"):
        bench_score.main(["--sizes", "1B"])


def test_run_times_each_kernel_and_compares_its_table(monkeypatch):
    """run() on the CPU (interpreter; graph_ms replaced by one call of its function): one row per case, in order
    (library launch, each --launch, each extra kernel), each case's scoring launched with ITS kernel, and each
    table compared with the library launch's (the all-heads kernel's equals it)."""
    import functools

    from mhar.routing import _kernels as K
    calls = []
    orig_score = K.score_sources
    monkeypatch.setattr(K, "score_sources", lambda *a, kernel=None, **kw: (calls.append(kernel),
                                                                            orig_score(*a, kernel=kernel, **kw)))
    monkeypatch.setattr(bench_score, "graph_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench_score, "_case", functools.partial(bench_score._case, device="cpu"))
    rows = bench_score.run("debug", 4, [(16, 4)], ("head", "heads"))
    assert [(r["kernel"], r["launch"]) for r in rows] == [("head", "library"), ("head", "16x4"), ("heads", "library")]
    n = 2 * 2 + 1  # sources of the debug preset: one scoring call each
    assert calls == ["head"] * n * 2 + ["heads"] * n
    assert rows[0]["max_rel_diff_vs_library"] == 0.0
    assert all(r["max_rel_diff_vs_library"] < 1e-5 for r in rows[1:])
    assert all(r["ms"] == 1.0 for r in rows)
