"""What the routing package and its fused kernels share, importable without torch or Triton: the fused path's
fixed parameters, the ``auto`` rule, and the two kernel settings read from the environment.

The names users choose from (``routing_impl``) are ``mhar.model.choices.ROUTING_IMPLS``.
"""
from __future__ import annotations

import os
from functools import lru_cache

from mhar.model.choices import ROUTING_IMPLS

READ_GROUP = 4  # announced reads per forward group: one pass over their common prefix (score table reads)
SOURCE_GROUP = 8  # consecutive sources whose gradients share one pass over the later reads' douts
# Widest head (D / H columns) that takes source groups: the group kernel holds a head's columns for a group's
# sources per token, which up to 160 (H = 8 at the 1B width) compiles without register spills for sm_90; wider
# heads (H = 4 at 350M / 1B, H = 1) would spill, so they take one pass over the later reads' douts per source.
SOURCE_GROUP_MAX_HEAD = 160
# Widest head that takes the score table: the scoring kernel holds a token block's head columns and the reads'
# weights for them in one tile; at 1024 columns (H = 1 at D = 1024) that tile needs 320 KiB of shared memory and
# does not launch on the H200, at 256 (H = 4) it runs (GPU tests). Wider heads score their sources in the
# forward kernels (one pass per read, or per group of reads over their common prefix).
TABLE_MAX_HEAD = 256

# The fused kernels' settings (documented in docs/ARCHITECTURE.md, "Routing"; provenance records them). Each
# maps to its accepted values; the first is what an unset variable means. They change speed, never results.
KERNEL_ENV_PREFIX = "MHAR_ROUTING_"
AUTOTUNE_ENV = KERNEL_ENV_PREFIX + "AUTOTUNE"  # 0: one launch configuration per kernel (tests, quick runs)
PDL_ENV = KERNEL_ENV_PREFIX + "PDL"  # 0: no programmatic dependent launch (on by default on sm_90+)
KERNEL_ENV = {AUTOTUNE_ENV: ("", "0", "1"), PDL_ENV: ("", "0", "1")}


def check_kernel_env() -> None:
    """Raise ValueError naming the variable and its values if a kernel setting has another value, or if a
    variable with the settings' prefix is not one of them (the trainer turns this into one ``error:`` line)."""
    for var, value in sorted(os.environ.items()):
        if not var.startswith(KERNEL_ENV_PREFIX):
            continue
        if var not in KERNEL_ENV:
            raise ValueError(f"{var}: not a routing kernel setting; the settings are {', '.join(KERNEL_ENV)} "
                             "(docs/ARCHITECTURE.md, Routing); unset it")
        got = value.strip()
        if got and got not in KERNEL_ENV[var]:
            values = ", ".join(v for v in KERNEL_ENV[var] if v)
            raise ValueError(f"{var}={got!r}: set it to one of {values} (or leave it unset)")


def kernel_env() -> dict[str, str]:
    """The routing kernel settings (``MHAR_ROUTING_*``) set in this process, for provenance."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(KERNEL_ENV_PREFIX)}


def autotune() -> bool:
    """Whether the fused kernels autotune their launch configurations (not under the Triton interpreter, nor
    with ``MHAR_ROUTING_AUTOTUNE=0``)."""
    return os.environ.get("TRITON_INTERPRET") != "1" and os.environ.get(AUTOTUNE_ENV, "").strip() != "0"


@lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether Triton imports in this process (what the fused kernels need)."""
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def resolve_routing_impl(impl: str, device) -> str:
    """The implementation that runs for ``routing_impl`` on ``device`` (a torch.device or its string): ``auto`` is
    ``fused`` on CUDA when Triton imports, else ``eager``; the other names are themselves. Routers resolve
    ``auto`` from the device of the first source of each forward (``AutoRouter.init``); the trainer records the
    result in provenance.json (``routing``)."""
    if impl not in ROUTING_IMPLS:
        raise ValueError(f"unknown routing implementation {impl!r}; choose one of {', '.join(ROUTING_IMPLS)}")
    if impl != "auto":
        return impl
    dev_type = getattr(device, "type", str(device).split(":")[0])
    return "fused" if dev_type == "cuda" and triton_available() else "eager"
