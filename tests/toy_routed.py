"""A routed residual variant defined outside mhar.model.residuals (tests/workflow/test_workflow.py: the workflow probes it
without an edit of its rules).

``toy_routed``: MHAR whose key RMSNorm weights start at 0.5 instead of 1 (a sharper-or-flatter depth softmax
only once the queries move). It inherits ``routes_full_depth`` from ``MultiHeadAttnRes``: one query per site
over every sublayer output, the layout ``eval.probe`` reads.
"""
from __future__ import annotations

from torch import nn

from mhar.model.residuals import register
from mhar.model.residuals.routed import MultiHeadAttnRes


@register("toy_routed")
class HalfKeyNormMHAR(MultiHeadAttnRes):
    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.constant_(self.key_norms, 0.5)
