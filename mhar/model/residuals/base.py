"""The one interface every residual variant implements.

The decoder loop is identical for all variants (see ``mhar.model.transformer.Transformer``):

    state = res.init(emb)
    for i, sublayer in enumerate(sublayers):      # attn0, mlp0, attn1, mlp1, ...
        h = res.read(state, i)                     # what sublayer i sees (before its pre-norm)
        state = res.write(state, i, sublayer(h))   # how its output is kept
    logits = head(final_norm(res.readout(state)))

A variant owns its parameters (queries, key norms, HC matrices, gates) and its
state layout; the block never asks which variant it runs. Routed variants
delegate source storage and reads to a ``mhar.model.routing.Router`` so eager /
compile / fused implementations are interchangeable.

``read`` normally returns (B, T, D). A variant may return (B, T, G, D) for an
attention sublayer (MHAR-HW: one mixture per KV group); ``Attention`` accepts both.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from torch import Tensor, nn

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig


class Residual(nn.Module):
    """Base class. Subclasses implement the four operations and register with ``@mhar.model.residuals.register``
    (which sets ``name``)."""

    name: str = "abstract"
    # True when the variant mixes its sources by depth routing (``mhar.model.routing``): learnable pseudo-queries,
    # zero-initialised so every routing softmax is uniform at init, and the routing weights logged per site when
    # ``routing_log`` is set. False: no routing weights exist (the registry-wide tests choose by it).
    routed: bool = False
    # True when every sublayer and the final read mix the embedding and ALL earlier sublayer outputs with one
    # (D,) pseudo-query per site (``queries`` / ``key_norms``, ``heads``, ``eps``; a list state on the eager
    # router): the layout the mechanism probe and the routing heatmap read (``routed_variants()``). Block and
    # delta variants route over block sums / deltas and MHAR-HW has per-group queries, so they keep False.
    routes_full_depth: bool = False
    # How tables and reports show the variant (``mhar.model.residuals.display_record``): its name there (None:
    # the registered name), its place among the variants (lower first; a variant without one comes after the
    # built-in ones, by name) and whether its routing head count H is part of that name ("MHAR H=8").
    display_name: Optional[str] = None
    table_order: int = 100
    shows_heads: bool = False
    # The routing head count the variant fixes whatever model.residual.heads says (single-head AttnRes: 1); the
    # tables' H column shows it (the head sweep's H=1). None: no fixed count.
    fixed_heads: Optional[int] = None
    # The knobs of mhar.model.config.VARIANT_KNOBS this variant reads (model.residual.<knob>); the others change
    # nothing it computes, and a variant override drops them from the run config with a warning
    # (mhar.runs.config.load_run_config: `cpu_tiny.yaml model.residual.variant=attnres` leaves no heads: 4).
    # None: not declared (a variant of your own): every knob is kept and its check_config decides.
    knobs: Optional[tuple[str, ...]] = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_sublayers = cfg.n_sublayers
        # When not None, routed variants store routing weights here: site name -> (B, T, H, N).
        self.routing_log: Optional[dict[str, Tensor]] = None

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        """Refuse a model config this variant cannot run (raise ``ConfigError`` naming the field); called by
        ``ModelConfig.validate`` and before the variant is built. The default accepts every config."""

    def init(self, emb: Tensor) -> Any:
        raise NotImplementedError

    def read(self, state: Any, i: int) -> Tensor:
        raise NotImplementedError

    def write(self, state: Any, i: int, out: Tensor) -> Any:
        raise NotImplementedError

    def readout(self, state: Any) -> Tensor:
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """Initialise this variant's own parameters (called after the model's N(0, 0.02^2) init)."""

    @staticmethod
    def site_name(i: int, n_sublayers: int) -> str:
        """Human-readable routing site: 'L3.attn', 'L3.mlp', or 'final'."""
        if i >= n_sublayers:
            return "final"
        return f"L{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}"
