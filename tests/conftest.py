"""Session-wide test setup.

Triton reads TRITON_INTERPRET when its kernels are first decorated, so it must be set before
any test module imports ``mhar.routing.fused``: on a machine without CUDA the fused kernels run
under the Triton interpreter (small shapes only).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
