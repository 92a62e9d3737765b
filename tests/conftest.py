"""Session-wide test setup.

Triton reads TRITON_INTERPRET when its kernels are first decorated, so it must be set before
any test module imports ``mhar.model.routing.fused``: on a machine without CUDA the fused kernels run
under the Triton interpreter (small shapes only).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The trainer and the adapter point torch.compile's / Triton's caches at the run's cache directory unless these
# are set (mhar.env.use_compile_cache); tests use throw-away run directories, so keep the caches in the usual
# per-user places (set before mhar.env is imported: they count as the user's settings).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      os.path.join(os.environ.get("TMPDIR", "/tmp"), f"torchinductor_{os.getuid()}"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".triton", "cache"))
