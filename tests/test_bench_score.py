"""benchmarks/bench_score.py on CPU: its launch argument is checked, and it refuses to run without a GPU
with one ``error:`` line (the timings themselves need CUDA: results/gpu/)."""
from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import bench_score


def test_launch_argument_parsed_and_checked():
    assert bench_score._launch_arg("32x8") == (32, 8, 1, 3)
    assert bench_score._launch_arg("32x4x4") == (32, 4, 4, 3)
    assert bench_score._launch_arg("64x8x2x2") == (64, 8, 2, 2)
    for bad in ("32", "8x4", "24x4", "32x3", "axb", "32x4x0", "32x4x2x9", "32x4x1x1x1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_score._launch_arg(bad)


def test_blocks_argument_parsed_and_checked():
    assert bench_score._blocks_arg("4") == (4, 3)
    assert bench_score._blocks_arg("8x2") == (8, 2)
    for bad in ("0", "4x0", "4x7", "4x2x1", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_score._blocks_arg(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_refuses_without_gpu():
    with pytest.raises(SystemExit, match="^error: bench_score times CUDA kernels"):
        bench_score.main(["--sizes", "1B"])
