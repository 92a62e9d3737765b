"""What the model config shares with the packages it names (residuals/, routing/), importable on its own (no torch).

``ConfigError``: the error every config check raises (its message names the field and what to do); ``brief``:
a value as its message shows it (a bounded prefix: a value read from a file may be huge).
``ROUTING_IMPLS``: the routing implementations a config may name (``model.residual.routing_impl``); the routing
package builds one router per name, the workflow schema and the benchmarks derive from it. ``auto``: ``fused`` on
CUDA when Triton imports, else ``eager`` (``mhar.model.routing.resolve_routing_impl``). An execution choice: a run
trained with one loads with another.
"""
from __future__ import annotations

import reprlib


class ConfigError(ValueError):
    """Invalid configuration. The message names the field and what to do."""


_REPR = reprlib.Repr()  # (attributes, not keywords: Python 3.10 and 3.11)
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 3, 60, 40, 60
_REPR.maxtuple = _REPR.maxlist = _REPR.maxarray = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxdeque = 4


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters; a long string or a big container is
    cut (with ``...``) without walking all of it."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


ROUTING_IMPLS = ("auto", "eager", "compile", "fused")

# Names of fused kernel variants that checkpoints and exports may store, all computing what ``fused`` computes:
# read as ``fused`` (``stored_routing_impl``); a new config must name ``fused`` (docs/PERFORMANCE.md names the
# commit of each).
_FUSED_ALIASES = frozenset({
    "fused_v5", "fused_sg4", "fused_sg8", "fused_v7", "fused_v7_sg8", "fused_v7_sg8_norm", "fused_v7_sg8_ts",
    "fused_v7_sg8_async", "fused_v7_sg8_defer", "fused_v7_sg8_overlap"})


def stored_routing_impl(impl: str) -> str:
    """``routing_impl`` as a stored config (checkpoint, export) names it -> the implementation's name in
    ``ROUTING_IMPLS``: an alias of the fused kernels is ``fused``; any other name is itself."""
    return "fused" if impl in _FUSED_ALIASES else impl


__all__ = ["ConfigError", "brief", "ROUTING_IMPLS", "stored_routing_impl"]
