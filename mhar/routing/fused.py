"""Fused Triton depth routing: routing_impl "fused" (kernels v6) and "fused_v5".

Same math as ``reference.route_reference`` (RMSNorm of keys, one online softmax
per head over the sources, weighted mix), see ``_kernels.py``.

v6 (``FusedRouter()``, "fused"): the forward makes one pass over the sources per
read (or, ``group=K``, K announced reads share one pass over their common prefix,
``prefix6_fwd``); the backward is source-major and writes every source gradient
once. The first read announces the next reads (``lookahead``: the model's static
pseudo-queries); an announced read's backward keeps its dout (``stash``), and the
backward of the first read that saw a source forms that source's gradient from all
later reads' douts in one pass (``source_bwd``): per microbatch about 2 byte units
instead of v5's 4 (``benchmarks/traffic_bound.py``). See ``_V6`` for the ordering
(a read-chain token) and the fallback of reads that were not announced. v6's appends
also write each source's sum of squares per token (``ss``), which its forward and
gradient kernels read instead of reducing every row per read.

v7 (``FusedRouter(table=True)``, "fused_v7"): v6 plus a score table: every buffered source is
scored once for all announced reads (their queries are static parameters), so no read re-scores a
source; see ``FusedRouter`` and ``_kernels.score_sources``.

The rest of this docstring describes v5 (``FusedRouter(algo="v5")``, "fused_v5"),
whose storage v6 shares.

Storage. The router state owns ONE shared source buffer ``buf`` (cap, B*T, D),
allocated once (capacity given at ``init``) and written once per source by
``append``; reads never stack. The buffer is a plain tensor that autograd does
not track. Gradients reach the sources through a gradient buffer ``gacc`` of the
same shape (the buffer's dtype by default), owned by the state:

* ``append`` is an autograd.Function ``_Append(src, token_prev) -> token`` that
  copies src into buf[n]. Its backward returns ``gacc[n]`` as the gradient of src.
* ``read`` is an autograd.Function ``_Read(token, q, g, null, extra) -> out`` that
  takes the newest token as input, so autograd runs the backward of every read
  that saw source n before the backward of append n (the token chain orders
  them). Each read's backward adds its source gradients into gacc (no atomics:
  one program owns a block of tokens; reads run one after another).

Sources may broadcast: a first source of shape (D,) or a stride-0 expansion of a
(D,) vector (the delta variant's learnable null source) is kept as a vector and
broadcast inside the kernel. ``extra`` is one transient source read after the
buffered ones (Block AttnRes' partial block sum). Saved for backward: the
log-sum-exp (B, T, H) fp32 only (less than the routing weights, (B, T, H, N)),
plus, for fp32 sources, the output (kept by the next layer anyway); for bf16
sources too by default (one backward pass; ``two_pass=True``: a first pass recomputes
<dout, out> per head in fp32 instead of taking it from the bf16-rounded output).

Prefix sharing (``group``): reads that announce the next reads' queries (``lookahead``)
can share one pass over their common prefix (``_Prefix`` computes K partials, each read
``_Merge``s its newer sources by online softmax); the backward either shares one pass
over the prefix too (``prefix_bwd``) or runs per read (``shared_backward=False``). Off by
default: measured slower on the H200 (results/bench/NOTES.md). bf16 backward takes
<dout, out> from the saved output (one pass) unless ``two_pass=True``.

The state is linear: appending twice to the same state is an error (the shared
buffer has one slot per position). Under autocast the buffer takes the autocast
dtype, so the kernel moves bf16 bytes. The Python glue is hidden from
torch.compile (``torch.compiler.disable``): a compiled model graph-breaks around
routing calls and runs the kernels as they are.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from . import DEFER_READS, SOURCE_GROUP, V7_GROUP, Router, register_router
from ._kernels import (LAUNCHES, append_source, dW_all, prefix6_fwd, prefix7_fwd, prefix_bwd, prefix_fwd,
                       prenorm_fwd, prenorm_stash, route_bwd, route_fwd, route_fwd7, score_sources, source_bwd,
                       source_group_bwd, split_weights, stash)

__all__ = ["FusedRouter", "FusedState", "route_fused", "LAUNCHES"]


def _check_device(t: Tensor) -> None:
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"routing_impl='fused' runs Triton kernels on CUDA tensors; got a tensor on {t.device}. "
            "Use routing_impl='eager'/'compile' on CPU (or set TRITON_INTERPRET=1 before importing, for tests)."
        )


@dataclass
class _Storage:
    """The shared buffers of one forward pass (one per router.init)."""

    capacity: int  # slots for full (B, T, D) sources
    null: Optional[Tensor] = None  # (D,) broadcast source 0, autograd-tracked, or None
    shape: Optional[torch.Size] = None  # (B, T, D) of full sources
    dtype: Optional[torch.dtype] = None
    buf: Optional[Tensor] = None  # (capacity, B*T, D), not tracked by autograd
    ss: Optional[Tensor] = None  # v6: (capacity, B*T) fp32, each buffered source's sum of squares per token
    n: int = 0  # slots written
    grad_dtype: Optional[torch.dtype] = None
    gacc: Optional[Tensor] = None  # (capacity, B*T, D) source gradients
    g_valid: list = field(default_factory=list)  # g_valid[j]: gacc slot j holds a valid partial sum
    two_pass: bool = False  # bf16 backward recomputes <dout, out> from the sources (see FusedRouter)
    shared_backward: bool = True  # a prefix-sharing group also shares one backward pass over its prefix
    reads: int = field(default=0)
    n_reads: int = 0  # reads announced by the first read's lookahead (sets the group size)
    group: Optional["_Group"] = None  # the open prefix-sharing group, if any
    v6: Optional["_V6"] = None  # source-major backward bookkeeping (algo "v6"), created by the first read
    source_group: int = 1  # v6: consecutive sources whose gradients share one pass over the later reads' douts
    group_scores: bool = False  # v7: the group pass takes its scores from the table (no x . w dots)
    defer_groups: int = 0  # v6: source-group passes start this many reads early, on a side stream (0: in order)
    src_dtypes: dict = field(default_factory=dict)  # slot -> dtype of the appended source (v6 gradients)

    def grads(self, device) -> Tensor:
        if self.gacc is None:
            B, T, D = self.shape
            self.gacc = torch.empty((self.capacity, B * T, D), device=device, dtype=self.grad_dtype)
            self.g_valid = [False] * self.capacity
        return self.gacc

    def acc_range(self, a: int, b: int) -> tuple[int, int]:
        """Before a kernel writes gacc[a:b): the interval of those slots to accumulate into (the others
        are overwritten); afterwards all of [a, b) are valid. Invalid slots amid valid ones are zeroed."""
        valid = [j for j in range(a, b) if self.g_valid[j]]
        if valid and valid[-1] - valid[0] + 1 != len(valid):
            for j in range(a, b):
                if not self.g_valid[j]:
                    self.gacc[j].zero_()
            rng = (a, b)
        else:
            rng = (valid[0], valid[-1] + 1) if valid else (0, 0)
        for j in range(a, b):
            self.g_valid[j] = True
        return rng


@dataclass
class _Group:
    """K reads sharing one pass over their common prefix (buf[0:n_prefix) and the null source).

    Created by the first read of the group (which passed ``lookahead``); read k of the group continues
    from the partial P[k] over the sources appended since. Backward: each read writes dP[k] / dlse[k]
    here; the prefix backward then reads them in one pass."""

    K: int
    n_prefix: int
    qptrs: list  # data_ptr of each read's query (checks that the reads come in the announced order)
    P: Optional[Tensor] = None  # (K, B, T, D) partial mixes, buffer dtype
    lse: Optional[Tensor] = None  # (K, B, T, H) fp32
    dP: Optional[Tensor] = None  # (K, B, T, D) gradients of the partials, written by the reads' backward
    deff: Optional[Tensor] = None  # (K, B, T, H) fp32: a_P * <dout, out> per read (see route_bwd)
    next: int = 0  # index of the next read
    p_dtype: Optional[torch.dtype] = None  # dtype of P (and of its gradient dP)
    outs: tuple = ()  # the prefix Function's outputs (P_0..P_{K-1}, lse_0..lse_{K-1}), autograd-tracked


@dataclass(frozen=True)
class FusedState:
    """Handle on a storage: the first ``n`` buffered sources and the token of the newest one."""

    storage: _Storage
    n: int
    token: Optional[Tensor]


class _Append(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: Tensor, token_prev: Optional[Tensor], st: _Storage, slot: int) -> Tensor:
        if st.ss is not None:  # v6: the copy also writes the source's sums of squares (the forward's RMS)
            append_source(src.reshape(st.buf.shape[1:]).contiguous(), st.buf[slot], st.ss[slot])
        else:
            st.buf[slot].view(st.shape).copy_(src)
        ctx.st, ctx.slot, ctx.src_dtype = st, slot, src.dtype
        st.src_dtypes[slot] = src.dtype
        # The token orders the backward (this append's runs after every read that saw the source); its value and
        # its gradient are never used: an uninitialised scalar, and None gradients (no fill kernel per call).
        ctx.set_materialize_grads(False)
        return torch.empty((), device=src.device, dtype=torch.float32)  # token

    @staticmethod
    def backward(ctx, _grad_token: Optional[Tensor]):
        st = ctx.st
        if st.v6 is not None:  # formed once by the backward of the first read that saw this source
            grad = st.v6.final.pop(ctx.slot, None)
            if grad is None:  # no read ever saw this source
                grad = torch.zeros(st.shape, device=st.buf.device, dtype=ctx.src_dtype)
            else:
                grad = grad.view(st.shape).to(ctx.src_dtype)
            return grad, None, None, None
        if st.gacc is None or not st.g_valid[ctx.slot]:  # no read ever saw this source
            grad = torch.zeros(st.shape, device=st.buf.device, dtype=ctx.src_dtype)
        else:
            grad = st.gacc[ctx.slot].view(st.shape).to(ctx.src_dtype)
        return grad, None, None, None


READS = {"plain": 0, "grouped": 0, "prefix": 0}  # forward calls per kind (tests: prove which path ran)


class _Read(torch.autograd.Function):
    calls = 0  # forward calls of any kind (tests: proves the fused path ran)

    @staticmethod
    def forward(ctx, token, query, norm_weight, null, extra, st: _Storage, n_buf: int, H: int, eps: float,
                want_scores: bool):
        _Read.calls += 1
        READS["plain"] += 1
        B, T, D = st.shape
        BT = B * T
        ex = None
        if extra is not None:
            ex = extra.reshape(BT, D)
            if ex.dtype != st.dtype:
                ex = ex.to(st.dtype)
            ex = ex.contiguous()
        q, g = query.contiguous(), norm_weight.contiguous()
        nul = null.contiguous() if null is not None else None
        out, lse, scores = route_fwd(st.buf if n_buf else None, n_buf, nul, ex, q, g, H, eps, BT, D, st.dtype,
                                     store_scores=want_scores)
        # Backward takes <dout, out> from the saved output (one pass over the sources, as FlashAttention does;
        # the sublayer reading ``out`` keeps it anyway), unless st.two_pass asks it to recompute <dout, out> in
        # fp32 from the sources (a second pass; exact also for a bf16-rounded output).
        keep_out = out.dtype == torch.float32 or not st.two_pass
        ctx.save_for_backward(q, g, nul, ex, out if keep_out else None, lse)
        ctx.st, ctx.n_buf, ctx.H, ctx.eps = st, n_buf, H, eps
        ctx.has_token, ctx.extra_dtype = token is not None, extra.dtype if extra is not None else None
        out = out.view(B, T, D)
        if want_scores:
            ctx.mark_non_differentiable(scores)
            return out, scores
        return out, None

    @staticmethod
    def backward(ctx, dout: Tensor, _dscores):
        q, g, nul, ex, out, lse = ctx.saved_tensors
        dq, dg, dnull, dextra = _full_backward(ctx, ctx.n_buf, q, g, nul, ex, out, lse, dout, null_index=3)
        dtoken = torch.zeros((), device=dout.device) if ctx.has_token else None
        return dtoken, dq, dg, dnull, dextra, None, None, None, None, None


def _full_backward(ctx, n: int, q, g, nul, ex, out, lse, dout, null_index: int, q_index: int = 1):
    """One read's own backward pass over all its sources ([null] + buf[0:n) + [extra]): accumulates the
    buffered sources' gradients into gacc; returns the gradients of query, norm weight, null and extra
    (None where autograd needs none; ``null_index`` is the null input's position in the Function)."""
    st = ctx.st
    B, T, D = st.shape
    BT = B * T
    gacc = st.grads(dout.device) if n else None
    rng = st.acc_range(0, n) if n else (0, 0)
    dw, dnull, dextra = route_bwd(st.buf if n else None, n, nul, ex, q, g, out,
                                  dout.reshape(BT, D).contiguous(), lse, gacc, rng, ctx.H, ctx.eps, BT, D)
    dq = (dw * g.float()).to(q.dtype) if ctx.needs_input_grad[q_index] else None
    dg = (dw * q.float()).to(g.dtype) if ctx.needs_input_grad[q_index + 1] else None
    dnull = dnull.to(nul.dtype) if dnull is not None and ctx.needs_input_grad[null_index] else None
    dextra = dextra.view(B, T, D).to(ctx.extra_dtype) if dextra is not None else None
    return dq, dg, dnull, dextra


class _Prefix(torch.autograd.Function):
    """K partials over the common prefix [null] + buf[0:n): outputs P_0..P_{K-1}, lse_0..lse_{K-1}."""

    @staticmethod
    def forward(ctx, token, Q, G, null, st: _Storage, grp: _Group, H: int, eps: float):
        READS["prefix"] += 1
        B, T, D = st.shape
        BT, n = B * T, grp.n_prefix
        Qc, Gc = Q.contiguous(), G.contiguous()
        nul = null.contiguous() if null is not None else None
        P, lse = prefix_fwd(st.buf if n else None, n, nul, Qc, Gc, H, eps, BT, D, st.dtype)
        grp.P, grp.lse, grp.p_dtype = P.view(grp.K, B, T, D), lse.view(grp.K, B, T, H), P.dtype
        ctx.save_for_backward(Qc, Gc, nul, lse)  # not P: transient, freed after the group's last read
        ctx.st, ctx.grp, ctx.H, ctx.eps, ctx.has_token = st, grp, H, eps, token is not None
        ctx.set_materialize_grads(False)
        return (*grp.P.unbind(0), *grp.lse.unbind(0))

    @staticmethod
    def backward(ctx, *grads):
        Q, G, nul, lse = ctx.saved_tensors
        st, grp = ctx.st, ctx.grp
        K, n = grp.K, grp.n_prefix
        B, T, D = st.shape
        BT = B * T
        dP, deff = grp.dP, grp.deff
        if dP is None:  # no read of the group reached backward
            return (None,) * 8
        # Read k's backward wrote dP[k] (returned as P_k's gradient) and deff[k]; P_k is internal to the
        # router, so nothing else can have added to its gradient.
        for k in range(K):
            if grads[k] is None or grads[k].data_ptr() != dP[k].data_ptr() or grads[K + k] is not None:
                raise RuntimeError("fused router: a prefix partial received a gradient from outside its read")
        gacc = st.grads(dP.device) if n else None
        rng = st.acc_range(0, n) if n else (0, 0)
        dW, dnull = prefix_bwd(st.buf if n else None, n, nul, Q, G, lse, dP.view(K, BT, D),
                               deff.view(K, BT, -1), gacc, rng, ctx.H, ctx.eps, BT, D)
        grp.dP = grp.deff = None
        dQ = (dW * G.float()).to(Q.dtype) if ctx.needs_input_grad[1] else None
        dG = (dW * Q.float()).to(G.dtype) if ctx.needs_input_grad[2] else None
        dnull = dnull.to(nul.dtype) if dnull is not None and ctx.needs_input_grad[3] else None
        dtoken = torch.zeros((), device=dP.device) if ctx.has_token else None
        return dtoken, dQ, dG, dnull, None, None, None, None


class _Merge(torch.autograd.Function):
    """Read k of a group: its prefix partial (P, lse) continued over buf[lo:n) and an optional extra."""

    @staticmethod
    def forward(ctx, token, query, norm_weight, P, lse_p, null, extra, st: _Storage, grp: _Group, k: int, n: int,
                H: int, eps: float):
        _Read.calls += 1
        READS["grouped"] += 1
        B, T, D = st.shape
        BT, lo = B * T, grp.n_prefix
        ex = None
        if extra is not None:
            ex = extra.reshape(BT, D)
            ex = (ex if ex.dtype == st.dtype else ex.to(st.dtype)).contiguous()
        q, g = query.contiguous(), norm_weight.contiguous()
        out, lse, _ = route_fwd(st.buf if n > lo else None, n, None, ex, q, g, H, eps, BT, D, st.dtype, lo=lo,
                                init=P.reshape(BT, D), init_lse=lse_p.reshape(BT, H))
        if k == grp.K - 1:
            grp.P = None  # the partials are transient: nothing keeps them for backward
        # Backward takes <dout, out> from the output, as FlashAttention does (in bf16 the output is rounded;
        # the sublayer that reads it keeps it anyway), so it needs neither P nor a pass over the prefix.
        nul = null.contiguous() if null is not None and not st.shared_backward else None
        ctx.save_for_backward(q, g, lse_p, nul, ex, out, lse)
        ctx.st, ctx.grp, ctx.k, ctx.n, ctx.H, ctx.eps = st, grp, k, n, H, eps
        ctx.has_token, ctx.extra_dtype = token is not None, extra.dtype if extra is not None else None
        return out.view(B, T, D)

    @staticmethod
    def backward(ctx, dout):
        q, g, lse_p, nul, ex, out, lse = ctx.saved_tensors
        st, grp, k, n = ctx.st, ctx.grp, ctx.k, ctx.n
        B, T, D = st.shape
        BT, lo = B * T, grp.n_prefix
        dtoken = torch.zeros((), device=dout.device) if ctx.has_token else None
        if not st.shared_backward:  # this read's own pass over all its sources (the forward's lse is the full one)
            dq, dg, dnull, dextra = _full_backward(ctx, n, q, g, nul, ex, out, lse, dout, null_index=5)
            return dtoken, dq, dg, None, None, dnull, dextra, None, None, None, None, None, None
        if grp.dP is None:
            grp.dP = torch.empty((grp.K, B, T, D), device=dout.device, dtype=grp.p_dtype)
            grp.deff = torch.empty_like(grp.lse)
        gacc = st.grads(dout.device) if n > lo else None
        rng = st.acc_range(lo, n) if n > lo else (0, 0)
        dw, _, dextra = route_bwd(st.buf if n > lo else None, n, None, ex, q, g, out,
                                  dout.reshape(BT, D).contiguous(), lse, gacc, rng, ctx.H, ctx.eps, BT, D, lo=lo,
                                  init_lse=lse_p.reshape(BT, ctx.H), dinit=grp.dP[k].view(BT, D),
                                  dinit_lse=grp.deff[k].view(BT, ctx.H))
        dq = (dw * g.float()).to(q.dtype) if ctx.needs_input_grad[1] else None
        dg = (dw * q.float()).to(g.dtype) if ctx.needs_input_grad[2] else None
        dextra = dextra.view(B, T, D).to(ctx.extra_dtype) if dextra is not None else None
        return dtoken, dq, dg, grp.dP[k], None, None, dextra, None, None, None, None, None, None


@dataclass
class _V6:
    """Bookkeeping of the source-major (write-once) backward of one forward (algo "v6").

    The first read announces itself and its ``lookahead`` reads (K in all; it is the *anchor*). A later read
    that is the next announced one (same query / norm tensors), sees at least as many sources as every
    earlier read and uses the same heads / eps is *source-major*: read k. Its forward writes lse[k]; its
    backward keeps dout in dbuf[k] and <dout, out> in delta[k], then forms the gradient of every source it
    was the first to see, once, from all source-major reads (they have all run their backward by then:
    reads are chained by a token, so backward visits them newest first). The anchor runs last and returns
    the query / norm gradients of all announced reads (dW accumulated over the sources) and the null's.
    Any other read (not announced, or over an older state) runs the v5 backward for its own part
    (accumulating into gacc, which the write-once kernel adds)."""

    K: int
    ptrs: list  # (query, norm_weight) data_ptr of each announced read
    W: Tensor  # (K, D) fp32: q_k * g_k
    lse: Tensor  # (K, BT, H) fp32
    H: int
    eps: float
    delta: Optional[Tensor] = None  # (K, BT, H) fp32
    dbuf: Optional[Tensor] = None  # (K, BT, D): the reads' douts
    dW: Optional[Tensor] = None  # (H, K, D / H) fp32: dL/dW accumulated over sources (head-major, as _dW gives it)
    dsr: Optional[Tensor] = None  # (H, K, capacity * BT), buffer dtype: every buffered source's dL/dscore * rms^-1
    # for the reads that saw it (zeros elsewhere), contracted with the buffer in ONE matmul by the anchor (dW_all)
    next_k: int = 0
    max_n: int = 0  # most buffered sources seen by any read so far
    k_hi: Optional[int] = None  # 1 + the newest source-major read whose backward ran
    final: dict = field(default_factory=dict)  # slot -> its gradient, until the append's backward takes it
    first_read: dict = field(default_factory=dict)  # slot -> the source-major read that saw it first (-1: none)
    partial: dict = field(default_factory=dict)  # slot -> (k, fp32 gradient over reads k.. from a group pass)
    rtoken: Optional[Tensor] = None  # chain token of the newest read
    done: bool = False  # the anchor's backward ran (a later read on this storage starts a new chain)
    group: Optional[tuple] = None  # forward prefix sharing: (k0, K, n_prefix, P (K, BT, D), lse (K, BT, H))
    S: Optional[Tensor] = None  # v7 score table (capacity, K, BT, H) fp32: S[j, k] = score of slot j in read k
    W_split: Optional[tuple] = None  # v7: W as score_sources takes it (hi / lo parts in the sources' dtype)
    scored: int = 0  # slots 0..scored-1 have their rows s_lo[j].. of S
    s_lo: dict = field(default_factory=dict)  # slot -> first read whose score row was computed
    pending: set = field(default_factory=set)  # async_scores: slots scored at their append, not yet joined
    events: dict = field(default_factory=dict)  # async_scores: slot -> CUDA event after its scoring (side stream)
    part_events: dict = field(default_factory=dict)  # defer_groups: slot -> CUDA event after its group pass
    early: Optional[tuple] = None  # early_prefix: (k0, K, n_prefix, P, lse, event) of the next group's prefix


# Widest head (D / H columns) that uses source groups: the group kernel holds a head's columns for a group's
# sources per token; at 160 (the 1B width, H = 8) and below it compiles without register spills for sm_90
# (64 and 80 at H = 16 too) and passed every launch configuration on the H200 (at 128 and 160); at 256 / 320
# (H = 4 at 350M / 1B) it spills 0.3-2.5 KB per thread (benchmarks/kernel_stats.py) and at H = 1 (attnres)
# far more, so wider heads take one pass over the later reads' douts per source (the v6 pass; same math).
SOURCE_GROUP_MAX_HEAD = 160


def _deferred_group(st: _Storage, v: "_V6", k: int) -> list:
    """defer_groups = d: the slots whose gradients the backward of read ``k`` forms in one pass over reads k..,
    on the side stream: the newest slot that read k - d saw first and up to ``st.source_group - 1`` older
    consecutive slots, each first seen by a source-major read and not yet in a group; every one of them is
    completed later, by its first reader, over the reads before k (after waiting for the pass). [] when that
    slot is in a group already (the sources are tiled from the newest down, as ``_source_group`` does)."""
    d = st.defer_groups
    if d < 1 or st.source_group <= 1 or k - d < 0 or v.dsr is None or st.shape[-1] // v.H > SOURCE_GROUP_MAX_HEAD:
        return []
    tops = [s_ for s_, r in v.first_read.items() if r == k - d]
    if not tops:
        return []
    top = max(tops)
    group = []
    s_ = top
    while len(group) < st.source_group and s_ >= 0 and 0 <= v.first_read.get(s_, -1) <= k - d \
            and s_ not in v.partial and s_ not in v.final:
        group.insert(0, s_)
        s_ -= 1
    return group if len(group) > 1 and group[-1] == top else []


def _source_group(st: _Storage, v: "_V6", slot: int, n_buf: int, k_first: int, init) -> list:
    """Slots whose gradients the backward of read ``k_first`` forms in one pass over reads k_first..: ``slot``
    (complete) and up to ``st.source_group - 1`` older consecutive slots (partial, completed later by their
    first reader over the reads before k_first). An older slot qualifies when a source-major read before
    k_first saw it first (so every read from that one on saw it, and all of them are source-major); only
    the newest slot of a read starts a group, and not when it has a v5-style accumulated gradient. Heads wider
    than ``SOURCE_GROUP_MAX_HEAD`` columns take no groups (register spills)."""
    group = [slot]
    if (st.source_group <= 1 or slot != n_buf - 1 or init is not None
            or st.shape[-1] // v.H > SOURCE_GROUP_MAX_HEAD):
        return group
    s_ = slot - 1
    while len(group) < st.source_group and s_ >= 0 and 0 <= v.first_read.get(s_, -1) < k_first \
            and s_ not in v.partial:
        group.insert(0, s_)
        s_ -= 1
    return group


def _dsr_slot(v: "_V6", slot: int, k_lo: int, k_hi: int, BT: int) -> Optional[Tensor]:
    """Slot's (H, k_hi - k_lo, BT) part of v.dsr (a strided view), or None without v.dsr."""
    if v.dsr is None:
        return None
    return v.dsr[:, k_lo:k_hi, slot * BT:(slot + 1) * BT]


def _table(v: "_V6", slot: int, k_first: int) -> Optional[Tensor]:
    """Slot's score table (K, BT, H) if its rows from read k_first on were computed (v7), else None."""
    if v.S is None or v.s_lo.get(slot, v.K) > k_first:
        return None
    return v.S[slot]


# async_scores: one side stream per CUDA device for the scoring launches made at appends
_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    """The side stream of ``device`` for scoring at appends, or None (CPU / interpreter: score in order)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx]


def _on_side_stream(device: torch.device, launch: Callable[[], Any]) -> tuple[Any, Optional["torch.cuda.Event"]]:
    """Run ``launch`` (kernel launches whose outputs the caller allocated on the current stream) on the side
    stream of ``device``, after the current stream's work so far; returns (its result, a CUDA event recorded
    after it, for the readers to wait on). CPU / interpreter: in order, (result, None)."""
    side = _side_stream(device)
    if side is None:
        return launch(), None
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        res = launch()
        ev = torch.cuda.Event()
        ev.record(side)
    return res, ev


def _join_scores(v: "_V6", device: torch.device, upto: Optional[int] = None) -> None:
    """async_scores: the current stream waits for the side-stream scoring of the pending slots <= ``upto``
    (all pending slots: None). One side stream runs them in order, so waiting for the newest one's event is
    enough; afterwards those slots' table rows may be read."""
    todo = [slot for slot in v.pending if upto is None or slot <= upto]
    if not todo:
        return
    ev = v.events.get(max(todo))
    if ev is not None:
        torch.cuda.current_stream(device).wait_event(ev)
    for slot in todo:
        v.pending.discard(slot)
        v.events.pop(slot, None)


def _launch_deferred_group(st: _Storage, v: "_V6", k: int, k_hi: int, H: int, eps: float, BT: int, D: int) -> None:
    """defer_groups: at the backward of read k (its dout stashed), start the pass of ``_deferred_group`` over
    reads k..k_hi-1 on the device's side stream (the partials allocated here, on the current stream), so it
    overlaps the following sublayers' backward; its members' first readers wait for it (``_join_part``)."""
    group = _deferred_group(st, v, k)
    if not group:
        return
    if v.W_split is None:
        v.W_split = split_weights(v.W, st.buf.dtype)
    tab = v.S if st.group_scores and all(_table(v, s_, k) is not None for s_ in group) else None
    if tab is not None and v.pending:
        _join_scores(v, st.buf.device)
    NG = len(group)
    out = (torch.empty(NG, BT, D, device=st.buf.device, dtype=torch.float32),
           torch.empty(NG, BT, H, device=st.buf.device, dtype=torch.float32))
    (parts, cparts), ev = _on_side_stream(st.buf.device, lambda: source_group_bwd(  # after this read's stash
        st.buf, st.ss, group[0], NG, v.dbuf, v.lse, v.delta, v.W_split, k, k_hi, v.dsr, H, eps, BT, D, scores=tab,
        out=out))
    LAUNCHES["source_group_deferred"] += 1
    for j, s_ in enumerate(group):
        v.partial[s_] = (k, parts[j], cparts[j])
        if ev is not None:
            v.part_events[s_] = ev


def _take_early(v: "_V6", device: torch.device) -> Optional[tuple]:
    """early_prefix: the prefix started at the previous read (k0, K, n_prefix, P, lse), the current stream made
    to wait for it (also when the caller drops it: a CUDA-graph capture must rejoin every side-stream fork)."""
    early, v.early = v.early, None
    if early is None:
        return None
    if early[5] is not None:
        torch.cuda.current_stream(device).wait_event(early[5])
    _join_scores(v, device, early[2] - 1)  # (their scoring ran before the prefix on the side stream)
    return early[:5]


def _join_part(v: "_V6", slot: int, device: torch.device) -> None:
    """defer_groups: the current stream waits for the side-stream group pass that wrote ``slot``'s partial."""
    ev = v.part_events.pop(slot, None)
    if ev is not None:
        torch.cuda.current_stream(device).wait_event(ev)


class _Read6(torch.autograd.Function):
    """One read of a v6 storage (see ``_V6``). Outputs (out, scores or None, read-chain token)."""

    @staticmethod
    def forward(ctx, token, rtoken, query, norm_weight, Qr, Gr, null, extra, st: _Storage, n_buf: int, H: int,
                eps: float, want_scores: bool, k: int, lo_new: int, k_next: int, lo: int, P, lse_p, table: bool,
                pn_w, pn_eps: float):
        _Read.calls += 1
        READS["plain"] += 1
        v = st.v6
        B, T, D = st.shape
        BT = B * T
        ex = None
        if extra is not None:
            ex = extra.reshape(BT, D)
            ex = (ex if ex.dtype == st.dtype else ex.to(st.dtype)).contiguous()
        q, g = query.contiguous(), norm_weight.contiguous()
        nul = null.contiguous() if null is not None else None
        y, rstd = None, None
        if table:  # v7: the scores from the table (no null / extra / returned weights: see FusedRouter._read6)
            res = route_fwd7(st.buf, v.S, k, lo if P is not None else 0, n_buf, H, BT, D, st.dtype,
                             init=P.reshape(BT, D) if P is not None else None,
                             init_lse=lse_p.reshape(BT, H) if P is not None else None, lse_out=v.lse[k],
                             prenorm=(pn_w, pn_eps) if pn_w is not None else None)
            out, lse = res[:2]
            if pn_w is not None:  # the pre-norm formed by the same kernel, from the rows in hand
                y, rstd = res[2:]
            scores = None
        elif P is None:
            out, lse, scores = route_fwd(st.buf if n_buf else None, n_buf, nul, ex, q, g, H, eps, BT, D, st.dtype,
                                         store_scores=want_scores, lse_out=v.lse[k] if k >= 0 else None, ss=st.ss)
        else:  # continue the shared prefix partial (which holds the null source) over buf[lo:n_buf)
            out, lse, scores = route_fwd(st.buf if n_buf > lo else None, n_buf, None, ex, q, g, H, eps, BT, D,
                                         st.dtype, lo=lo, init=P.reshape(BT, D), init_lse=lse_p.reshape(BT, H),
                                         lse_out=v.lse[k], ss=st.ss)
        if pn_w is None:
            y = out
        elif y is None:  # the next sublayer's pre-norm (an announced read): return RMSNorm(out) * pn_w
            y, rstd = prenorm_fwd(out, pn_w, pn_eps, H, BT, D)
        ctx.save_for_backward(q, g, nul, ex, out, lse, Qr, Gr, rstd, pn_w)
        ctx.st, ctx.n_buf, ctx.H, ctx.eps, ctx.k, ctx.lo_new, ctx.k_next = st, n_buf, H, eps, k, lo_new, k_next
        ctx.extra_dtype = extra.dtype if extra is not None else None
        rtok = torch.empty((), device=out.device, dtype=torch.float32)  # chain token: value never used
        ctx.set_materialize_grads(False)  # (its gradient neither: None, no fill kernel)
        if want_scores:
            ctx.mark_non_differentiable(scores)
        return y.view(B, T, D), scores, rtok

    @staticmethod
    def backward(ctx, dout, _dscores, _drtoken):
        q, g, nul, ex, out, lse, Qr, Gr, rstd, pn_w = ctx.saved_tensors
        st, k, H, eps = ctx.st, ctx.k, ctx.H, ctx.eps
        v = st.v6
        B, T, D = st.shape
        BT = B * T
        if dout is None:  # the output reached no loss (gradients are not materialised, see forward)
            dout = torch.zeros_like(out)
        dout2 = dout.reshape(BT, D).contiguous()
        dq = dg = dQr = dGr = dnull = dextra = dpn_w = None
        if v.early is not None:  # early_prefix: a next group's prefix whose read never came
            _take_early(v, st.buf.device)
        if v.pending:  # async_scores: reads were left unissued; the gradient kernels read the table
            _join_scores(v, st.buf.device)
        if k >= 0:
            if v.k_hi is None:  # the newest source-major read to reach backward runs first
                v.k_hi = k + 1
            if v.dbuf is None:
                v.dbuf = torch.empty((v.K, BT, D), device=dout.device, dtype=st.dtype)
                v.delta = torch.empty((v.K, BT, H), device=dout.device, dtype=torch.float32)
                v.dW = torch.zeros((H, v.K, D // H), device=dout.device, dtype=torch.float32)
                if H * v.K * st.buf.shape[0] * BT < 2**31:  # else one dW matmul per source
                    v.dsr = torch.zeros((H, v.K, st.buf.shape[0] * BT), device=dout.device, dtype=st.buf.dtype)
            if pn_w is not None:  # dout is dL/d(normed): the norm's backward and the stash in one pass
                dw = prenorm_stash(dout2, out, pn_w, rstd, v.dbuf[k], v.delta[k], H, BT, D)
                dpn_w = dw.to(pn_w.dtype) if ctx.needs_input_grad[20] else None
                dout2 = v.dbuf[k]  # dL/d(read output), for the transient source below
            else:
                stash(dout2, out, v.dbuf[k], v.delta[k], H, BT, D)
            if ex is not None:  # the transient source is seen by this read only: its gradient now
                dw_e, _, dextra = route_bwd(None, 0, None, ex, q, g, out, dout2, lse, None, (0, 0), H, eps, BT, D)
                v.dW[:, k] += dw_e.view(H, D // H)
        else:  # v5 backward for this read's own part: accumulates into gacc, returns its own dq / dg / dnull
            dq, dg, dnull, dextra = _full_backward(ctx, ctx.n_buf, q, g, nul, ex, out, lse, dout, null_index=6,
                                                  q_index=2)
            dextra = dextra.reshape(BT, D) if dextra is not None else None
        k_first = k if k >= 0 else ctx.k_next
        k_hi = v.k_hi or 0
        for slot in range(ctx.lo_new, ctx.n_buf):  # sources no earlier read saw: their gradient is complete
            init = st.gacc[slot] if st.gacc is not None and st.g_valid[slot] else None
            gdtype = st.src_dtypes.get(slot, st.dtype)
            if slot not in v.partial and k_first < k_hi:
                group = _source_group(st, v, slot, ctx.n_buf, k_first, init) if v.dsr is not None else [slot]
                if len(group) > 1:  # this slot and the older ones share ONE pass over reads k_first..: partials
                    if v.W_split is None:
                        v.W_split = split_weights(v.W, st.buf.dtype)
                    tab = v.S if st.group_scores and all(_table(v, s_, k_first) is not None for s_ in group) else None
                    parts, cparts = source_group_bwd(st.buf, st.ss, group[0], len(group), v.dbuf, v.lse, v.delta,
                                                     v.W_split, k_first, k_hi, v.dsr, H, eps, BT, D, scores=tab)
                    for j, s_ in enumerate(group):
                        v.partial[s_] = (k_first, parts[j], cparts[j])
            part = v.partial.pop(slot, None)
            if part is not None:  # defer_groups: its group pass may still run on the side stream
                _join_part(v, slot, st.buf.device)
            if part is None and k_first >= k_hi:
                grad = init
            else:
                k_end, cinit = k_hi, None
                if part is not None:  # a group pass covered reads k_end.. already (all but the RMS term, which
                    k_end, grad, cinit = part  # needs every head: cinit): add the reads before them (none for
                    init = grad if init is None else grad + init.float()  # the group's newest slot)
                grad, dW = source_bwd(st.buf[slot], False, v.dbuf, v.lse, v.delta, v.W, k_first, k_end, init, gdtype,
                                      H, eps, BT, D, ss=st.ss[slot], scores=_table(v, slot, k_first),
                                      dsr_out=_dsr_slot(v, slot, k_first, k_end, BT), cinit=cinit)
                if dW is not None:
                    v.dW[:, k_first:k_end] += dW
            if grad is not None:
                v.final[slot] = grad
        if k >= 0 and k < k_hi:  # defer_groups: an older group's pass over reads k.., off the critical path
            _launch_deferred_group(st, v, k, k_hi, H, eps, BT, D)
        if k == 0:  # the anchor: every other read has run its backward
            for slot in list(v.part_events):  # (every partial is consumed by now; defensively, before dW_all)
                _join_part(v, slot, st.buf.device)
            v.done = True
            if nul is not None and k_hi > 0:
                dn, dW = source_bwd(nul, True, v.dbuf, v.lse, v.delta, v.W, 0, k_hi, None, torch.float32, H, eps,
                                    BT, D)
                v.dW[:, :k_hi] += dW
                dnull = dn.to(nul.dtype) if ctx.needs_input_grad[6] else None
            if v.dsr is not None:  # every source's part in one matmul (slots 0..n-1 of the buffer)
                v.dW += dW_all(v.dsr, st.buf, st.n, H)
            dW = v.dW.transpose(0, 1).reshape(v.K, D)  # (K, D)
            if ctx.needs_input_grad[2]:
                dq = (dW[0] * g.float()).to(q.dtype)
            if ctx.needs_input_grad[3]:
                dg = (dW[0] * q.float()).to(g.dtype)
            if Qr is not None and ctx.needs_input_grad[4]:
                dQr = (dW[1:] * Gr.float()).to(Qr.dtype)
            if Gr is not None and ctx.needs_input_grad[5]:
                dGr = (dW[1:] * Qr.float()).to(Gr.dtype)
            # The backward of this forward is over: drop the douts, and the read-chain token, whose autograd node
            # (holding ctx.st) made a reference cycle storage -> token -> node -> storage that kept every step's
            # source and dout buffers allocated until the garbage collector ran (measured: +1.9 GiB at 350M).
            v.dbuf = v.delta = v.dW = v.rtoken = v.S = v.W_split = v.dsr = None
        if dnull is not None and not ctx.needs_input_grad[6]:
            dnull = None
        dextra = dextra.view(B, T, D).to(ctx.extra_dtype) if dextra is not None else None
        return (None, None, dq, dg, dQr, dGr, dnull, dextra) + (None,) * 12 + (dpn_w, None)


def _env_int(name: str) -> Optional[int]:
    val = os.environ.get(name)
    if not val:
        return None
    try:
        return int(val)
    except ValueError:
        raise ValueError(f"environment variable {name}={val!r}: expected an integer"
                         + (" or 'auto'" if name == "MHAR_ROUTING_GROUP" else "")) from None


def _broadcast_vector(t: Tensor) -> Optional[Tensor]:
    """The (D,) vector behind a source that broadcasts over tokens, else None."""
    if t.dim() == 1:
        return t
    if t.numel() == t.shape[-1] or all(s == 0 for s in t.stride()[:-1]):
        return t[(0,) * (t.dim() - 1)]  # (D,) view
    return None


class FusedRouter(Router):
    """Router backed by the fused Triton kernels and one shared source buffer per forward.

    grad_dtype: dtype of the source-gradient accumulator. Default None = the
    buffer's dtype, which rounds like eager autograd (it sums the per-read bf16
    source gradients in bf16); torch.float32 accumulates exactly at twice the
    gradient traffic and memory.
    group: reads per prefix-sharing group: 1 (the default: none), K > 1, or "auto"
    (about sqrt(reads per forward), see ``group_size``); None reads the env
    ``MHAR_ROUTING_GROUP`` (same values). No sharing is the default because on the
    H200 it measured fastest at the paper's sizes (results/bench/NOTES.md): the
    shared pass saves bytes but the prefix kernels reach lower bandwidth.
    shared_backward: a group's backward also makes one pass over its prefix for all
    its reads (``prefix_bwd``); False: every read's backward makes its own pass over
    all its sources (the forward still shares; env ``MHAR_ROUTING_SHARED_BWD=0|1``).
    two_pass: the bf16 backward of a plain read recomputes <dout, out> in fp32 from
    the sources (a second pass) instead of taking it from the bf16 output.
    source_group (v6): up to this many consecutive sources get their gradients from ONE
    pass over the later reads' douts (``source_group_bwd``: tensor-core dots; fp32 partial
    gradients, each completed by its source's first reader over the few reads between, the
    RMS term included); 1 (default) = one pass per source. routing_impl "fused_sg8" = 8:
    on the H200 the routing op took 6.95 / 10.38 ms per microbatch against v6's 8.76 / 10.78 at
    350M / 1B, the 350M training step 0.863x the baseline against 0.832x (results/bench/NOTES.md);
    every autotuned launch configuration of the group kernel passed on the H200 at head widths 128
    and 160. Heads wider than SOURCE_GROUP_MAX_HEAD take no groups.
    table (v7, routing_impl "fused_v7" = table with group 4): the score table. The queries are
    static, so each buffered source is scored ONCE for every announced read (``score_sources``,
    tensor-core dots) when the first announced read sees it; reads then take their scores from
    the table (``route_fwd7``: the max first, then one multiply-add per element and source;
    ``prefix7_fwd``: a group's K reads mixed in one pass over their prefix), and the gradient
    kernel reads them too. Only without a null source (the table holds buffered sources) and for
    announced reads without ``extra`` / ``return_weights`` (others run the v6 kernels, same math).
    Memory: (capacity, K, B*T, H) fp32 per forward, freed by the backward. routing_impl
    "fused_v7_sg8" (table, forward groups of 4, source groups of 8) is the fastest on the H200 and
    the paper configs' MHAR H=8 routing: training step 0.906x / 0.899x / 0.899x the baseline at
    100M / 350M / 1B (means of 6 / 5 / 4 runs, sd ~0.004; memory 1.04 / 1.03 / 1.02x); every launch
    configuration of its kernels passed its GPU test (results/bench/NOTES.md).
    prenorm (routing_impl "fused_v7_sg8_norm"; correct on the H200, no faster than "fused_v7_sg8":
    0.901x vs 0.903x at 1B, 0.905x vs 0.908x at 100M in the same runs): ``read(..., prenorm=norm)``
    returns the reader's RMSNorm of the mix, and an announced read's backward forms the norm's input gradient
    and stashes it in one pass (``prenorm_stash``) instead of a separate norm backward; the residual uses it
    through ``read_normed`` and the model skips the sublayer's own norm.
    group_scores (routing_impl "fused_v7_sg8_ts"; needs table and source groups): the source-group pass
    reads each (source, read) score from the table instead of recomputing it with two tensor-core dots
    per column part (the same fp32 scores the forward used). Offline sm_90 compile (Triton 3.9,
    benchmarks/kernel_stats.py): 10-20% fewer loop instructions per dout element (1B: 13.85 vs 16.74
    in the best spill-free configuration). On the H200 (session 2026-12-02f) it is correct in every launch
    configuration but no faster: the group kernel is latency bound at 12.5% occupancy (Nsight Compute), so
    fewer instructions do not show (1B step's group passes 2.341 ms vs 2.249 ms for fused_v7_sg8, two
    sessions). Opt-in, not recommended.
    async_scores (routing_impl "fused_v7_sg8_async"; needs table and forward groups; opt-in; correct on the
    H200, not timed alone): the scoring kernel is latency bound (0.78 ms per 1B microbatch for 0.56 GB, results/bench/NOTES.md)
    and sits between each append and the next read. With this option a source appended after the anchor read
    is scored at its append, on a side stream (``_score_ahead``), so the scoring overlaps the next sublayer's
    work; the reads that would need its table row before it can be joined do without it: a group's prefix
    (``prefix7_fwd``) stops before the group's newest source, and each read mixes the sources after its prefix
    with scores of its own (the v6 kernel, ``route_fwd``, continuing the prefix partial). The prefix waits for
    the side stream's scoring of its sources (``_join_scores``: an event per scoring), the last announced read
    for all of it (so a CUDA-graph capture rejoins its side stream), and so does any backward that finds
    scoring pending. Same math; the scores a read forms itself equal the table's to fp32 rounding. Bytes: each
    later group reads its first read's newest source once per read instead of once (byte model
    ``v6_bytes(async_scores=True)``). On the CPU the scoring runs in order at the append.
    defer_groups = d (routing_impl "fused_v7_sg8_defer" = d 1 (``DEFER_READS``), "fused_v7_sg8_overlap" = with
    async_scores; needs source_group > 1; opt-in; "_overlap" is correct on the H200 and no faster than
    "fused_v7_sg8" in the training step, results/bench/NOTES.md): the source-group pass is the
    largest routing kernel (2.25 of 7.36 ms per 1B step) and latency bound at 12.5% occupancy, and in order it
    runs between a read's backward and the sublayer backward that needs the read's newest source gradient.
    Only that newest member is needed at once; the older members are needed by their own first readers, later.
    So below the newest group, the pass of a group is started at the backward of the read d after its newest
    member's first reader, on the side stream (``_deferred_group``, ``_launch_deferred_group``), over the reads
    from there on; it overlaps d sublayers' backward, and every member, the newest too, is completed by its
    first reader over the reads before (d reads more each; ``_join_part`` waits for the pass first). The groups
    are the same slots as without deferral (tiled from the newest down). Same math.
    early_prefix (needs async_scores; in "fused_v7_sg8_overlap", above; opt-in): with
    async_scores a group's prefix pass stops before its first read's newest source, i.e. it covers exactly the
    sources buffered at the read before. So the last read of a group starts the next group's prefix pass
    (``_start_early_prefix``) on the side stream, beside the sublayer between the two reads, and the next read
    waits for it (``_take_early``) and continues from it (a read with an extra source too). The bytes are
    async_scores' own; the prefix pass (1.54 of 7.36 ms per 1B step) leaves the critical path.
    """

    name = "fused"

    def __init__(self, grad_dtype: Optional[torch.dtype] = None, group: Optional[int] = None,
                 shared_backward: Optional[bool] = None, two_pass: bool = False, algo: str = "v6",
                 source_group: int = 1, table: bool = False, prenorm: bool = False, group_scores: bool = False,
                 async_scores: bool = False, defer_groups: int = 0, early_prefix: bool = False):
        if algo not in ("v6", "v5"):
            raise ValueError(f"algo must be 'v6' (source-major backward, routing_impl 'fused') or 'v5' "
                             f"(read-major, routing_impl 'fused_v5'), got {algo!r}")
        if not isinstance(source_group, int) or source_group < 1 or (source_group > 1 and algo != "v6"):
            raise ValueError(f"source_group must be an integer >= 1 (v6 only; 1 = one pass over the later reads' "
                             f"douts per source), got {source_group!r}")
        if table and algo != "v6":
            raise ValueError("table (the v7 score table) is an option of the v6 kernels")
        if prenorm and algo != "v6":
            raise ValueError("prenorm (the next sublayer's pre-norm fused into the read) is an option of the v6 kernels")
        if group_scores and not (table and source_group > 1):
            raise ValueError("group_scores (the source-group pass reads the v7 score table) needs table=True and "
                             "source_group > 1")
        if async_scores and not (table and (group or 1) > 1):
            raise ValueError("async_scores (scoring each source at its append, on a side stream) needs table=True and "
                             "forward groups (group > 1)")
        self.algo, self.source_group, self.table, self.prenorm = algo, source_group, bool(table), bool(prenorm)
        if not isinstance(defer_groups, int) or defer_groups < 0 or (defer_groups and source_group < 2):
            raise ValueError(f"defer_groups (reads by which each source-group pass starts early, on a side stream) "
                             f"must be an integer >= 0 and needs source_group > 1, got {defer_groups!r}")
        if early_prefix and not async_scores:
            raise ValueError("early_prefix (a group's prefix pass started at the read before it, on a side stream) "
                             "needs async_scores=True")
        self.group_scores, self.async_scores = bool(group_scores), bool(async_scores)
        self.defer_groups, self.early_prefix = defer_groups, bool(early_prefix)
        if algo == "v6":
            self.name = "fused_v7" if table else "fused" if source_group == 1 else f"fused_sg{source_group}"
            if shared_backward is not None or two_pass:
                raise ValueError("shared_backward / two_pass are options of the v5 kernels "
                                 "(routing_impl 'fused_v5', FusedRouter(algo='v5')); v6 has none of them")
            group = 1 if group is None else group
            if not isinstance(group, int) or group < 1:
                raise ValueError(f"group must be an integer >= 1 (1 = no forward prefix sharing), got {group!r}")
            # v6 group: announced reads per forward prefix-sharing group (constructor only; the env variable
            # MHAR_ROUTING_GROUP is read by v5 alone)
            self.grad_dtype, self.group, self.shared_backward, self.two_pass = grad_dtype, group, True, False
            return
        self.name = "fused_v5"
        self.grad_dtype = grad_dtype
        if group is None:
            env = os.environ.get("MHAR_ROUTING_GROUP", "").strip()
            group = "auto" if env == "auto" else _env_int("MHAR_ROUTING_GROUP")
            group = 1 if group is None else group
        if group != "auto" and (not isinstance(group, int) or group < 1):
            raise ValueError(f"group must be an integer >= 1 (1 = no prefix sharing) or 'auto', got {group!r}")
        self.group = group  # reads per prefix-sharing group; "auto": about sqrt(reads per forward), at most 8
        if shared_backward is None:
            env = _env_int("MHAR_ROUTING_SHARED_BWD")
            shared_backward = bool(env) if env is not None else True
        self.shared_backward = shared_backward
        self.two_pass = two_pass

    def group_size(self, n_reads: int) -> int:
        """Reads per group for a forward of ``n_reads`` routed reads. Traffic per forward + backward is about
        (K^2 / 2 + 4) per group for the reads' own sources and partials plus 4 passes over each group's
        prefix (N^2 / 2K in all), least near K = sqrt(N); K is capped at 8 (registers: K x D fp32 per token)."""
        if self.group != "auto":
            return self.group
        return max(1, min(8, round(n_reads ** 0.5)))

    @torch.compiler.disable
    def init(self, first: Tensor, capacity: int) -> FusedState:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 (most sources ever held), got {capacity}")
        _check_device(first)
        vec = _broadcast_vector(first)
        st = _Storage(capacity=capacity, two_pass=self.two_pass, shared_backward=self.shared_backward,
                      source_group=self.source_group, group_scores=self.group_scores, defer_groups=self.defer_groups)
        if vec is not None:
            st.null, st.capacity = vec, capacity - 1
            if first.dim() == 3:
                self._allocate(st, first.shape, first)
            return FusedState(st, 0, None)
        self._allocate(st, first.shape, first)
        return self._append(FusedState(st, 0, None), first)

    def _allocate(self, st: _Storage, shape, like: Tensor) -> None:
        if len(shape) != 3:
            raise ValueError(f"sources must be (B, T, D) (or a broadcast (D,) first source); got shape {tuple(shape)}")
        dtype = like.dtype
        if torch.is_autocast_enabled(like.device.type):
            dtype = torch.get_autocast_dtype(like.device.type)
        st.shape, st.dtype = torch.Size(shape), dtype
        st.grad_dtype = self.grad_dtype or dtype
        B, T, D = shape
        st.buf = torch.empty((max(st.capacity, 1), B * T, D), device=like.device, dtype=dtype)
        if self.algo == "v6":
            st.ss = torch.empty((max(st.capacity, 1), B * T), device=like.device, dtype=torch.float32)

    @torch.compiler.disable
    def append(self, state: FusedState, src: Tensor) -> FusedState:
        st = state.storage
        if st.buf is None:
            self._allocate(st, src.shape, src)
        return self._append(state, src)

    def _append(self, state: FusedState, src: Tensor) -> FusedState:
        st = state.storage
        if state.n != st.n:
            raise RuntimeError(
                f"fused router: append to a stale state (state holds {state.n} sources, buffer {st.n}); "
                "the shared buffer is linear: append only to the newest state"
            )
        if st.n >= st.capacity:
            raise RuntimeError(f"fused router: capacity {st.capacity} exceeded; pass a larger capacity to init()")
        if src.shape != st.shape:
            raise ValueError(f"fused router: source shape {tuple(src.shape)} != buffer shape {tuple(st.shape)}")
        token = _Append.apply(src, state.token, st, st.n)
        st.n += 1
        if self.async_scores:
            self._score_ahead(st, st.n - 1)
        return FusedState(st, st.n, token)

    def _start_early_prefix(self, st: _Storage, v: "_V6", k0: int, n: int, H: int, BT: int, D: int) -> None:
        """early_prefix: the prefix pass of the group of announced reads starting at ``k0`` (the next read), over
        the ``n`` sources buffered now, on the side stream (after this read's kernels and, in its order, the
        scoring of those sources). With async_scores the group's prefix stops before its first read's newest
        source anyway, so this is that same pass, started one sublayer earlier: it overlaps the sublayer
        between the two reads. The read ``k0`` waits for it (``_take_early``)."""
        K = min(self.group, v.K - k0)
        if K <= 1 or n < 1 or v.scored < n or any(v.s_lo.get(slot, v.K) > k0 for slot in range(n)):
            return
        P = torch.empty(K, BT, D, device=st.buf.device, dtype=st.dtype)
        lse = torch.empty(K, BT, H, device=st.buf.device, dtype=torch.float32)
        _, ev = _on_side_stream(st.buf.device, lambda: prefix7_fwd(st.buf, v.S, k0, K, n, H, BT, D, st.dtype,
                                                                   out=(P, lse)))
        LAUNCHES["prefix7_early"] += 1
        v.early = (k0, K, n, P, lse, ev)

    @staticmethod
    def _score_ahead(st: _Storage, slot: int) -> None:
        """async_scores: score the source just appended to ``slot`` for every announced read still to come, now,
        on the device's side stream (after the append's copy), instead of at its first reader: the scoring then
        overlaps the next sublayer instead of delaying the next read. The first reader mixes this source with
        scores of its own (v6 kernel, ``route_fwd``); later readers and the backward take the table's, after
        ``_join_scores``. Only while a forward's announced reads are pending and every older slot is scored."""
        v = st.v6
        if v is None or v.done or v.S is None or v.scored != slot or v.next_k >= v.K:
            return
        k_lo = v.next_k  # the first announced read to see this slot
        if v.W_split is None:
            v.W_split = split_weights(v.W, st.buf.dtype)
        _, ev = _on_side_stream(st.buf.device,  # after the append's copy
                                lambda: score_sources(st.buf, st.ss, v.W, v.S, slot, k_lo, v.H, v.eps, v.W_split))
        if ev is not None:
            v.events[slot] = ev
        LAUNCHES["score_ahead"] += 1
        v.s_lo[slot] = k_lo
        v.scored = slot + 1
        v.pending.add(slot)

    def num_sources(self, state: FusedState) -> int:
        return state.n + (state.storage.null is not None)

    @torch.compiler.disable
    def read(self, state: FusedState, query, norm_weight, num_heads, eps=1e-6, *, extra=None,
             return_weights=False, lookahead=None, prenorm=None):
        """One routed read. ``lookahead = (Q, G)`` (M, D): queries / key norms of the next M reads, which the
        caller promises to issue in that order, each on this state plus the sources appended meanwhile. The
        first read of a group then computes the partials of up to ``group`` reads in one pass over the
        common prefix, and the following reads only add their new sources. ``prenorm``: the reader's RMSNorm
        module (``weight``, ``eps``; x * rsqrt(mean(x^2) + eps) * weight, fp32 math, in the mix's dtype): return
        its norm of the routed mix instead of the mix. Announced v6 reads form it in the read kernel and fuse its
        backward with the dout stash (``prenorm_stash``); other reads call the module on the mix."""
        st = state.storage
        D = query.shape[-1]
        if D % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide the model width D={D}")
        if st.shape is None:
            if extra is None:
                raise ValueError("fused router: read needs at least one (B, T, D) source to know the shape")
            self._allocate(st, extra.shape, extra)
        if extra is not None and extra.shape != st.shape:
            extra = extra.expand(st.shape)
        _check_device(query)
        if self.algo == "v6":
            return self._read6(state, query, norm_weight, num_heads, eps, extra, return_weights, lookahead,
                               prenorm)
        if prenorm is not None:  # v5 has no fused pre-norm: the module norms the mix
            out = self.read(state, query, norm_weight, num_heads, eps, extra=extra, return_weights=return_weights,
                            lookahead=lookahead)
            return (prenorm(out[0]), out[1]) if return_weights else prenorm(out)
        grp = st.group
        if grp is not None and (return_weights or grp.next >= grp.K):
            st.group = grp = None  # finished (or abandoned for an analysis read)
        if grp is None and not return_weights and lookahead is not None and state.n + (st.null is not None) > 0:
            if st.reads == 0:  # the first read announces all the others
                st.n_reads = 1 + lookahead[0].shape[0]
            K = min(self.group_size(st.n_reads), 1 + lookahead[0].shape[0])
            if K > 1:
                Q = torch.cat([query[None], lookahead[0][:K - 1]])
                G = torch.cat([norm_weight[None], lookahead[1][:K - 1]])
                grp = st.group = _Group(K=K, n_prefix=state.n,
                                        qptrs=[query.data_ptr()] + [t.data_ptr() for t in lookahead[0][:K - 1]])
                outs = _Prefix.apply(state.token, Q, G, st.null, st, grp, num_heads, eps)
                grp.outs = outs
        if grp is not None:
            k = grp.next
            if query.data_ptr() != grp.qptrs[k] or state.n < grp.n_prefix:
                raise RuntimeError(
                    f"fused router: read {k} of a prefix-sharing group got a different query or an older state "
                    "than announced by lookahead; pass lookahead only for reads issued next, in order")
            grp.next += 1
            out = _Merge.apply(state.token, query, norm_weight, grp.outs[k], grp.outs[grp.K + k], st.null, extra,
                               st, grp, k, state.n, num_heads, eps)
            if grp.next == grp.K:
                grp.outs = ()  # drop the last references to the partials
            st.reads += 1
            return out
        out, scores = _Read.apply(state.token, query, norm_weight, st.null, extra, st, state.n, num_heads, eps,
                                  return_weights)
        st.reads += 1
        if return_weights:
            B, T, D = st.shape
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            return out, torch.exp(scores - lse).view(B, T, num_heads, -1)  # (B, T, H, N) fp32
        return out


    def _read6(self, state: FusedState, query, norm_weight, H, eps, extra, return_weights, lookahead, prenorm=None):
        st = state.storage
        B, T, D = st.shape
        v = st.v6
        if v is not None and v.done:  # this state's reads were backpropagated: later reads start a new chain
            v = st.v6 = None
            st.g_valid = [False] * len(st.g_valid)
        if v is None:  # the first read: the anchor, announcing itself and the lookahead reads
            Qr, Gr = lookahead if lookahead is not None and lookahead[0].shape[0] > 0 else (None, None)
            W = (query.detach().float() * norm_weight.detach().float())[None]
            ptrs = [(query.data_ptr(), norm_weight.data_ptr())]
            if Qr is not None:
                W = torch.cat([W, Qr.detach().float() * Gr.detach().float()])
                ptrs += [(Qr[i].data_ptr(), Gr[i].data_ptr()) for i in range(Qr.shape[0])]
            lse = torch.empty((len(ptrs), B * T, H), device=query.device, dtype=torch.float32)
            v = st.v6 = _V6(K=len(ptrs), ptrs=ptrs, W=W.contiguous(), lse=lse, H=H, eps=eps)
            if self.table and st.null is None:  # v7: every buffered source's scores for all announced reads
                v.S = torch.empty((max(st.capacity, 1), v.K, B * T, H), device=query.device, dtype=torch.float32)
        else:
            Qr = Gr = None
        n = state.n
        k = -1
        if (v.next_k < v.K and v.ptrs[v.next_k] == (query.data_ptr(), norm_weight.data_ptr())
                and n >= v.max_n and H == v.H and eps == v.eps):
            k, v.next_k = v.next_k, v.next_k + 1
        k_next = k if k >= 0 else v.next_k
        lo_new = min(v.max_n, n)  # this read is the first to see buffered sources lo_new..n-1
        for slot in range(lo_new, n):
            v.first_read[slot] = k
        v.max_n = max(v.max_n, n)
        early = _take_early(v, st.buf.device) if v.early is not None else None  # early_prefix (then joined)
        if k >= 0 and v.S is not None and v.pending and k == v.K - 1:  # async_scores: the last announced read:
            _join_scores(v, st.buf.device)  # every scoring joins the current stream (before capture ends)
        if k >= 0 and v.S is not None:  # v7: score the sources no announced read has scored yet, once
            for slot in range(v.scored, n):
                if v.W_split is None:
                    v.W_split = split_weights(v.W, st.buf.dtype)
                score_sources(st.buf, st.ss, v.W, v.S, slot, k, H, eps, v.W_split)
                v.s_lo[slot] = k
            v.scored = max(v.scored, n)
        table = k >= 0 and v.S is not None and extra is None and not return_weights
        # async_scores: the newest source's table row may still be in flight (scored at its append on the side
        # stream): a new group's prefix stops before it, and each read mixes the sources after its prefix with
        # scores of its own (v6 kernel); the table rows of the prefix are joined first
        n_pre = n - 1 if table and (n - 1) in v.pending else n
        lo, P, lse_p = 0, None, None
        if k >= 0 and self.group > 1 and not return_weights:  # forward prefix sharing among announced reads
            grp = v.group
            if grp is None or not grp[0] <= k < grp[0] + grp[1]:
                v.group = grp = None
                K = min(self.group, v.K - k)
                if early is not None and early[0] == k and early[1] == K and early[2] <= n:
                    v.group = grp = early  # started on the side stream at the previous read, over its sources
                    # (a read with an extra source continues from it too, in the v6 kernel)
                elif K > 1 and table and n_pre > 0:
                    _join_scores(v, st.buf.device, n_pre - 1)
                    Pk, lk = prefix7_fwd(st.buf, v.S, k, K, n_pre, H, B * T, D, st.dtype)
                    v.group = grp = (k, K, n_pre, Pk, lk)
                elif K > 1 and n + (st.null is not None) > 0:
                    Pk, lk = prefix6_fwd(st.buf if n else None, n, st.null.contiguous() if st.null is not None
                                         else None, v.W[k:k + K], H, eps, B * T, D, st.dtype, ss=st.ss)
                    v.group = grp = (k, K, n, Pk, lk)
            if grp is not None:
                lo, P, lse_p = grp[2], grp[3][k - grp[0]], grp[4][k - grp[0]]
                if k == grp[0] + grp[1] - 1:
                    v.group = None  # the partials are transient
        if table and any(slot in v.pending for slot in range(lo if P is not None else 0, n)):
            if P is None:  # (no prefix: the last read alone, which joined every scoring above; or n == 1)
                _join_scores(v, st.buf.device)
            else:
                table = False  # the sources after the prefix with this read's own scores (route_fwd)
        fuse = prenorm is not None and k >= 0 and not return_weights  # the norm's backward joins the stash
        pn_w, pn_eps = (prenorm.weight, float(prenorm.eps)) if fuse else (None, 0.0)
        out, scores, v.rtoken = _Read6.apply(state.token, v.rtoken, query, norm_weight, Qr, Gr, st.null, extra, st,
                                             n, H, eps, return_weights, k, lo_new, k_next, lo, P, lse_p, table,
                                             pn_w, pn_eps)
        st.reads += 1
        if self.early_prefix and k >= 0 and v.S is not None and extra is None and not return_weights \
                and v.group is None:  # the next read starts a group: its prefix now, beside the next sublayer
            self._start_early_prefix(st, v, k + 1, n, H, B * T, D)
        if prenorm is not None and not fuse:
            out = prenorm(out)
        if return_weights:
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            return out, torch.exp(scores - lse).view(B, T, H, -1)  # (B, T, H, N) fp32
        return out


def route_fused(sources: Tensor, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6,
                return_weights: bool = False, algo: str = "v6"):
    """Fused counterpart of ``route_reference`` (same signature): stacked sources (N, B, T, D)."""
    router = FusedRouter(algo=algo)
    st = router.init(sources[0], capacity=sources.shape[0])
    for s in sources[1:]:
        st = router.append(st, s)
    return router.read(st, query, norm_weight, num_heads, eps, return_weights=return_weights)


register_router("fused", FusedRouter)
register_router("fused_v5", lambda: FusedRouter(algo="v5"))
register_router("fused_sg4", lambda: FusedRouter(source_group=4))  # v6 with source groups of 4
register_router(f"fused_sg{SOURCE_GROUP}", lambda: FusedRouter(source_group=SOURCE_GROUP))  # v6 + source groups
register_router(f"fused_v7_sg{SOURCE_GROUP}",  # v7 (score table, forward groups) + source groups
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP))
register_router("fused_v7", lambda: FusedRouter(table=True, group=V7_GROUP))
register_router(f"fused_v7_sg{SOURCE_GROUP}_ts",  # fused_v7_sg8 whose group pass reads the table's scores
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP, group_scores=True))
register_router(f"fused_v7_sg{SOURCE_GROUP}_async",  # fused_v7_sg8 scoring each source at its append (side stream)
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP, async_scores=True))
register_router(f"fused_v7_sg{SOURCE_GROUP}_defer",  # fused_v7_sg8, group passes one read early on a side stream
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP, defer_groups=DEFER_READS))
register_router(f"fused_v7_sg{SOURCE_GROUP}_overlap",  # scoring at appends, deferred group passes, early prefixes
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP, async_scores=True,
                                    defer_groups=DEFER_READS, early_prefix=True))
register_router(f"fused_v7_sg{SOURCE_GROUP}_norm",  # fused_v7_sg8 + the next sublayer's pre-norm in the read
                lambda: FusedRouter(table=True, group=V7_GROUP, source_group=SOURCE_GROUP, prenorm=True))  # v6 + the score table + groups
