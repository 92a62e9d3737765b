"""Hardware counters of the routing kernels (Nsight Compute), on one microbatch of the routing op.

    ncu --clock-control none --profile-from-start off -k regex:_src_bwd --launch-skip 60 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        python3 -m benchmarks.ncu_routing 1B fused

Runs ``profile_step``'s op function (every read of one microbatch, forward + backward, as
``bench_routing_op`` times it) twice to autotune, then once inside cudaProfilerStart/Stop, so ncu
(``--profile-from-start off``) sees only the kernels of one tuned microbatch.
"""
from __future__ import annotations

import sys

import torch

from benchmarks.common import tuned_lines
from benchmarks.profile_step import _op_fn


def main(argv=None) -> None:
    size, impl = (argv or sys.argv[1:])[:2]
    fn = _op_fn(size, impl)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"NCU_ROUTING {size} {impl}: one microbatch profiled")
    print("\n".join(tuned_lines()))  # the launch configuration the autotuner chose per kernel / shape


if __name__ == "__main__":
    main()
