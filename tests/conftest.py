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


import logging  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.quick_tier import QUICK  # noqa: E402

_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """The quick tier (tests/quick_tier.py): `python -m pytest -m quick` runs in minutes on 2 cores."""
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(_TESTS).as_posix()
        except ValueError:
            continue
        left_out = QUICK.get(rel)
        if left_out is None or item.get_closest_marker("slow") or item.get_closest_marker("gpu"):
            continue
        if item.name not in left_out and getattr(item, "originalname", item.name) not in left_out:
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def _logging_handlers_per_test():
    """CLIs under test configure logging: eval.run's ``logging.basicConfig`` binds the root logger, lm-eval's CLI
    binds the ``lm_eval`` logger (once per process: ``lm_eval.utils._LOGGING_CONFIGURED``), each to the stderr
    pytest captured for *that* test and closes after it. A later test in the same worker then logs into a closed
    stream ("--- Logging error ---" on its stderr, which the one-error-line checks read). Every test starts with
    the handlers it found and leaves them so: what a test's CLI bound is unbound afterwards."""
    def loggers():
        found = logging.Logger.manager.loggerDict.values()
        return [logging.getLogger()] + [lg for lg in found if isinstance(lg, logging.Logger)]

    saved = {lg: (set(lg.handlers), lg.propagate) for lg in loggers()}
    utils = sys.modules.get("lm_eval.utils")
    configured = getattr(utils, "_LOGGING_CONFIGURED", False)
    yield
    for lg in loggers():
        before, propagate = saved.get(lg, (set(), lg.propagate))
        for h in list(lg.handlers):  # pytest's own capture handlers come and go with its phases: left alone
            if h not in before and not type(h).__module__.startswith("_pytest"):
                lg.removeHandler(h)
        lg.propagate = propagate
    utils = sys.modules.get("lm_eval.utils")
    if utils is not None and hasattr(utils, "_LOGGING_CONFIGURED"):
        utils._LOGGING_CONFIGURED = bool(configured)
