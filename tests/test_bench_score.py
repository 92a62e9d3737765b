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
