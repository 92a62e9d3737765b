"""Fused Triton depth routing, routing_impl ``fused``: the math of ``reference.route_reference`` in the kernels
of ``_kernels.py``.

Storage. A forward's sources live in ONE buffer ``buf`` (capacity, B*T, D), written once by ``append``
(``append_source``, which also writes each source's sum of squares per token, ``ss``: the kernels read it instead
of reducing every row again). Autograd does not track the buffer: ``append`` is ``_Append(src, token) -> token``
and ``read`` is ``_Read(token, ...)``, so the backward of every read that saw source n runs before the backward of
append n, which hands source n its gradient. Saved for backward: each read's output and log-sum-exp.

Forward. The first read announces the reads to come (``lookahead``: the model's static pseudo-queries, in
order). Each buffered source is then scored once for all announced reads (the score table, ``score_sources``),
every announced read mixes its sources with the table's scores (``route_fwd_table``), and groups of ``READ_GROUP``
consecutive announced reads share one pass over their common prefix (``prefix_fwd_table``). Reads the table does not
serve (heads wider than ``TABLE_MAX_HEAD`` columns, a broadcast null source, a transient ``extra`` source, ``return_weights``, a read nobody announced) score
their sources themselves (``route_fwd``; a group's shared prefix ``prefix_fwd``).

Backward, source-major: an announced read's backward keeps its dout (``stash``), and the backward of the first
read that saw a source forms that source's gradient ONCE from every later read's dout (``source_bwd``; for up to
``SOURCE_GROUP`` consecutive sources with heads of at most ``SOURCE_GROUP_MAX_HEAD`` columns, one pass over those
douts serves the whole group: ``source_group_bwd``). The queries' and key norms' gradients of all reads come from
one matmul (``dW_all``). A read that was not announced (or reads an older state) runs a backward of its own over
its sources (``route_bwd``), accumulating into a gradient buffer that the write-once kernel adds in.

A first source of shape (D,), or a stride-0 expansion of one (the delta variant's learnable null source), is kept
as a vector and broadcast in the kernels. Under autocast the buffer takes the autocast dtype. The state is linear:
append only to the newest state. The Python glue is hidden from torch.compile (``torch.compiler.disable``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from mhar.model.routing._kernels import (LAUNCHES, append_source, dW_all, prefix_fwd, prefix_fwd_table, route_bwd,
                                         route_fwd, route_fwd_table, score_sources, source_bwd, source_group_bwd,
                                         split_weights, stash)
from mhar.model.routing.names import READ_GROUP, SOURCE_GROUP, SOURCE_GROUP_MAX_HEAD, TABLE_MAX_HEAD
from mhar.model.routing.base import Router

__all__ = ["FusedRouter", "FusedState", "route_fused", "LAUNCHES", "SOURCE_GROUP_MAX_HEAD", "TABLE_MAX_HEAD"]


def _check_device(t: Tensor) -> None:
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"routing_impl='fused' runs Triton kernels on CUDA tensors; got a tensor on {t.device}. "
            "Use routing_impl='auto' or 'eager' on CPU (or set TRITON_INTERPRET=1 before importing, for tests)."
        )


@dataclass
class _Storage:
    """The shared buffers of one forward pass (one per router.init)."""

    capacity: int  # slots for full (B, T, D) sources
    null: Optional[Tensor] = None  # (D,) broadcast source 0, autograd-tracked, or None
    shape: Optional[torch.Size] = None  # (B, T, D) of full sources
    dtype: Optional[torch.dtype] = None
    buf: Optional[Tensor] = None  # (capacity, B*T, D), not tracked by autograd
    ss: Optional[Tensor] = None  # (capacity, B*T) fp32, each buffered source's sum of squares per token
    n: int = 0  # slots written
    gacc: Optional[Tensor] = None  # (capacity, B*T, D): unannounced reads' source gradients (``route_bwd``)
    g_valid: list = field(default_factory=list)  # g_valid[j]: gacc slot j holds a valid partial sum
    reads: Optional["_Reads"] = None  # source-major backward bookkeeping, created by the first read
    source_group: int = 1  # consecutive sources whose gradients share one pass over the later reads' douts
    src_dtypes: dict = field(default_factory=dict)  # slot -> dtype of the appended source

    def grads(self, device) -> Tensor:
        if self.gacc is None:
            B, T, D = self.shape
            self.gacc = torch.empty((self.capacity, B * T, D), device=device, dtype=self.dtype)
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


@dataclass(frozen=True)
class FusedState:
    """Handle on a storage: the first ``n`` buffered sources and the token of the newest one."""

    storage: _Storage
    n: int
    token: Optional[Tensor]


class _Append(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: Tensor, token_prev: Optional[Tensor], st: _Storage, slot: int) -> Tensor:
        append_source(src.reshape(st.buf.shape[1:]).contiguous(), st.buf[slot], st.ss[slot])
        ctx.st, ctx.slot, ctx.src_dtype = st, slot, src.dtype
        st.src_dtypes[slot] = src.dtype
        # The token orders the backward (this append's runs after every read that saw the source); its value and
        # its gradient are never used: an uninitialised scalar, and None gradients (no fill kernel per call).
        ctx.set_materialize_grads(False)
        return torch.empty((), device=src.device, dtype=torch.float32)  # token

    @staticmethod
    def backward(ctx, _grad_token: Optional[Tensor]):
        st = ctx.st
        if st.reads is not None:  # formed once by the backward of the first read that saw this source
            grad = st.reads.final.pop(ctx.slot, None)
        elif st.gacc is not None and st.g_valid[ctx.slot]:
            grad = st.gacc[ctx.slot]
        else:
            grad = None
        if grad is None:  # no read ever saw this source
            return torch.zeros(st.shape, device=st.buf.device, dtype=ctx.src_dtype), None, None, None
        return grad.view(st.shape).to(ctx.src_dtype), None, None, None


def _full_backward(ctx, n: int, q, g, nul, ex, out, lse, dout, null_index: int, q_index: int):
    """One read's own backward pass over all its sources ([null] + buf[0:n) + [extra]): accumulates the
    buffered sources' gradients into gacc; returns the gradients of query, norm weight, null and extra
    (None where autograd needs none; ``null_index`` / ``q_index``: the inputs' positions in the Function)."""
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


@dataclass
class _Reads:
    """Bookkeeping of the source-major (write-once) backward of one forward.

    The first read announces itself and its ``lookahead`` reads (K in all; it is the *anchor*). A later read
    that is the next announced one (same query / norm tensors), sees at least as many sources as every
    earlier read and uses the same heads / eps is *source-major*: read k. Its forward writes lse[k]; its
    backward keeps dout in dbuf[k] and <dout, out> in delta[k], then forms the gradient of every source it
    was the first to see, once, from all source-major reads (they have all run their backward by then:
    reads are chained by a token, so backward visits them newest first). The anchor runs last and returns
    the query / norm gradients of all announced reads (dW accumulated over the sources) and the null's.
    Any other read (not announced, or over an older state) runs its own backward (``_full_backward``,
    accumulating into gacc, which the write-once kernel adds)."""

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
    partial: dict = field(default_factory=dict)  # slot -> (k, fp32 gradient over reads k.., RMS-term part)
    rtoken: Optional[Tensor] = None  # chain token of the newest read
    done: bool = False  # the anchor's backward ran (a later read on this storage starts a new chain)
    group: Optional[tuple] = None  # forward prefix sharing: (k0, K, n_prefix, P (K, BT, D), lse (K, BT, H))
    S: Optional[Tensor] = None  # score table (capacity, K, BT, H) fp32: S[j, k] = score of slot j in read k
    W_split: Optional[tuple] = None  # W as score_sources takes it (hi / lo parts in the sources' dtype)
    scored: int = 0  # slots 0..scored-1 have their rows s_lo[j].. of S
    s_lo: dict = field(default_factory=dict)  # slot -> first read whose score row was computed


def _source_group(st: _Storage, v: _Reads, slot: int, n_buf: int, k_first: int, init) -> list:
    """Slots whose gradients the backward of read ``k_first`` forms in one pass over reads k_first..: ``slot``
    (complete) and up to ``st.source_group - 1`` older consecutive slots (partial, completed later by their
    first reader over the reads before k_first). An older slot qualifies when a source-major read before
    k_first saw it first (so every read from that one on saw it, and all of them are source-major); only
    the newest slot of a read starts a group, and not when it has an accumulated gradient (``init``). Heads wider
    than ``SOURCE_GROUP_MAX_HEAD`` columns take no groups."""
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


def _dsr_slot(v: _Reads, slot: int, k_lo: int, k_hi: int, BT: int) -> Optional[Tensor]:
    """Slot's (H, k_hi - k_lo, BT) part of v.dsr (a strided view), or None without v.dsr."""
    if v.dsr is None:
        return None
    return v.dsr[:, k_lo:k_hi, slot * BT:(slot + 1) * BT]


def _table(v: _Reads, slot: int, k_first: int) -> Optional[Tensor]:
    """Slot's score table (K, BT, H) if its rows from read k_first on were computed, else None."""
    if v.S is None or v.s_lo.get(slot, v.K) > k_first:
        return None
    return v.S[slot]


class _Read(torch.autograd.Function):
    """One read of a storage (see ``_Reads``). Outputs (out, scores or None, read-chain token)."""

    calls = 0  # forward calls (tests: proves the fused path ran)

    @staticmethod
    def forward(ctx, token, rtoken, query, norm_weight, Qr, Gr, null, extra, st: _Storage, n_buf: int, H: int,
                eps: float, want_scores: bool, k: int, lo_new: int, k_next: int, lo: int, P, lse_p, table: bool):
        _Read.calls += 1
        v = st.reads
        B, T, D = st.shape
        BT = B * T
        ex = None
        if extra is not None:
            ex = extra.reshape(BT, D)
            ex = (ex if ex.dtype == st.dtype else ex.to(st.dtype)).contiguous()
        q, g = query.contiguous(), norm_weight.contiguous()
        nul = null.contiguous() if null is not None else None
        scores = None
        if table:  # the scores from the table (no null / extra / returned weights: see FusedRouter.read)
            out, lse = route_fwd_table(st.buf, v.S, k, lo if P is not None else 0, n_buf, H, BT, D, st.dtype,
                                  init=P.reshape(BT, D) if P is not None else None,
                                  init_lse=lse_p.reshape(BT, H) if P is not None else None, lse_out=v.lse[k])
        elif P is None:
            out, lse, scores = route_fwd(st.buf if n_buf else None, st.ss, n_buf, nul, ex, q, g, H, eps, BT, D,
                                         st.dtype, store_scores=want_scores, lse_out=v.lse[k] if k >= 0 else None)
        else:  # continue the shared prefix partial (which holds the null source) over buf[lo:n_buf)
            out, lse, scores = route_fwd(st.buf if n_buf > lo else None, st.ss, n_buf, None, ex, q, g, H, eps, BT,
                                         D, st.dtype, lo=lo, init=P.reshape(BT, D), init_lse=lse_p.reshape(BT, H),
                                         lse_out=v.lse[k])
        ctx.save_for_backward(q, g, nul, ex, out, lse, Qr, Gr)
        ctx.st, ctx.n_buf, ctx.H, ctx.eps, ctx.k, ctx.lo_new, ctx.k_next = st, n_buf, H, eps, k, lo_new, k_next
        ctx.extra_dtype = extra.dtype if extra is not None else None
        rtok = torch.empty((), device=out.device, dtype=torch.float32)  # chain token: value never used
        ctx.set_materialize_grads(False)  # (its gradient neither: None, no fill kernel)
        if want_scores:
            ctx.mark_non_differentiable(scores)
        return out.view(B, T, D), scores, rtok

    @staticmethod
    def backward(ctx, dout, _dscores, _drtoken):
        q, g, nul, ex, out, lse, Qr, Gr = ctx.saved_tensors
        st, k, H, eps = ctx.st, ctx.k, ctx.H, ctx.eps
        v = st.reads
        B, T, D = st.shape
        BT = B * T
        if dout is None:  # the output reached no loss (gradients are not materialised, see forward)
            dout = torch.zeros_like(out)
        dout2 = dout.reshape(BT, D).contiguous()
        dq = dg = dQr = dGr = dnull = dextra = None
        if k >= 0:
            if v.k_hi is None:  # the newest source-major read to reach backward runs first
                v.k_hi = k + 1
            if v.dbuf is None:
                v.dbuf = torch.empty((v.K, BT, D), device=dout.device, dtype=st.dtype)
                v.delta = torch.empty((v.K, BT, H), device=dout.device, dtype=torch.float32)
                v.dW = torch.zeros((H, v.K, D // H), device=dout.device, dtype=torch.float32)
                if H * v.K * st.buf.shape[0] * BT < 2**31:  # else one dW matmul per source
                    v.dsr = torch.zeros((H, v.K, st.buf.shape[0] * BT), device=dout.device, dtype=st.buf.dtype)
            stash(dout2, out, v.dbuf[k], v.delta[k], H, BT, D)
            if ex is not None:  # the transient source is seen by this read only: its gradient now
                dw_e, _, dextra = route_bwd(None, 0, None, ex, q, g, out, dout2, lse, None, (0, 0), H, eps, BT, D)
                v.dW[:, k] += dw_e.view(H, D // H)
        else:  # a read nobody announced: its own backward, accumulating into gacc
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
                    parts, cparts = source_group_bwd(st.buf, st.ss, group[0], len(group), v.dbuf, v.lse, v.delta,
                                                     v.W_split, k_first, k_hi, v.dsr, H, eps, BT, D)
                    for j, s_ in enumerate(group):
                        v.partial[s_] = (k_first, parts[j], cparts[j])
            part = v.partial.pop(slot, None)
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
        if k == 0:  # the anchor: every other read has run its backward
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
            # The backward of this forward is over: drop the douts, the table, and the read-chain token, whose
            # autograd node (holding ctx.st) made a reference cycle storage -> token -> node -> storage that kept
            # every step's source and dout buffers allocated until the garbage collector ran.
            v.dbuf = v.delta = v.dW = v.rtoken = v.S = v.W_split = v.dsr = None
        if dnull is not None and not ctx.needs_input_grad[6]:
            dnull = None
        dextra = dextra.view(B, T, D).to(ctx.extra_dtype) if dextra is not None else None
        return (None, None, dq, dg, dQr, dGr, dnull, dextra) + (None,) * 12


def _broadcast_vector(t: Tensor) -> Optional[Tensor]:
    """The (D,) vector behind a source that broadcasts over tokens, else None."""
    if t.dim() == 1:
        return t
    if t.numel() == t.shape[-1] or all(s == 0 for s in t.stride()[:-1]):
        return t[(0,) * (t.dim() - 1)]  # (D,) view
    return None


class FusedRouter(Router):
    """Router on the fused Triton kernels and one shared source buffer per forward (see the module docstring).

    The defaults are routing_impl ``fused``. ``table``: the score table (each source scored once for all
    announced reads); ``group``: announced reads per forward group sharing one pass over their prefix (1: none);
    ``source_group``: consecutive sources whose gradients share one pass over the later reads' douts (1: one pass
    per source). Same math with any of them; tests vary them to reach every kernel path at small sizes.
    """

    name = "fused"

    def __init__(self, group: int = READ_GROUP, source_group: int = SOURCE_GROUP, table: bool = True):
        for arg, val in (("group", group), ("source_group", source_group)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{arg} must be an integer >= 1 (1 = no sharing), got {val!r}")
        self.group, self.source_group, self.table = group, source_group, bool(table)

    @torch.compiler.disable
    def init(self, first: Tensor, capacity: int) -> FusedState:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 (most sources ever held), got {capacity}")
        _check_device(first)
        vec = _broadcast_vector(first)
        st = _Storage(capacity=capacity, source_group=self.source_group)
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
        B, T, D = shape
        st.buf = torch.empty((max(st.capacity, 1), B * T, D), device=like.device, dtype=dtype)
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
        return FusedState(st, st.n, token)

    def num_sources(self, state: FusedState) -> int:
        return state.n + (state.storage.null is not None)

    @torch.compiler.disable
    def read(self, state: FusedState, query, norm_weight, num_heads, eps=1e-6, *, extra=None,
             return_weights=False, lookahead=None):
        """One routed read. ``lookahead = (Q, G)`` (M, D): queries / key norms of the next M reads, which the
        caller promises to issue in that order, each on this state plus the sources appended meanwhile (the
        first read's lookahead announces them; later reads' lookahead is not needed)."""
        st = state.storage
        D = query.shape[-1]
        H = num_heads
        if D % H:
            raise ValueError(f"num_heads={H} must divide the model width D={D}")
        if st.shape is None:
            if extra is None:
                raise ValueError("fused router: read needs at least one (B, T, D) source to know the shape")
            self._allocate(st, extra.shape, extra)
        if extra is not None and extra.shape != st.shape:
            extra = extra.expand(st.shape)
        _check_device(query)
        B, T, D = st.shape
        v = st.reads
        if v is not None and v.done:  # this state's reads were backpropagated: later reads start a new chain
            v = st.reads = None
            st.g_valid = [False] * len(st.g_valid)
        if v is None:  # the first read: the anchor, announcing itself and the lookahead reads
            Qr, Gr = lookahead if lookahead is not None and lookahead[0].shape[0] > 0 else (None, None)
            W = (query.detach().float() * norm_weight.detach().float())[None]
            ptrs = [(query.data_ptr(), norm_weight.data_ptr())]
            if Qr is not None:
                W = torch.cat([W, Qr.detach().float() * Gr.detach().float()])
                ptrs += [(Qr[i].data_ptr(), Gr[i].data_ptr()) for i in range(Qr.shape[0])]
            lse = torch.empty((len(ptrs), B * T, H), device=query.device, dtype=torch.float32)
            v = st.reads = _Reads(K=len(ptrs), ptrs=ptrs, W=W.contiguous(), lse=lse, H=H, eps=eps)
            if self.table and st.null is None and query.shape[-1] // H <= TABLE_MAX_HEAD:
                # every buffered source's scores for all announced reads (heads up to TABLE_MAX_HEAD columns)
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
        if k >= 0 and v.S is not None:  # score the sources no announced read has scored yet, once
            for slot in range(v.scored, n):
                if v.W_split is None:
                    v.W_split = split_weights(v.W, st.buf.dtype)
                score_sources(st.buf, st.ss, v.W, v.S, slot, k, H, eps, v.W_split)
                v.s_lo[slot] = k
            v.scored = max(v.scored, n)
        table = k >= 0 and v.S is not None and extra is None and not return_weights
        lo, P, lse_p = 0, None, None
        if k >= 0 and self.group > 1 and not return_weights:  # forward prefix sharing among announced reads
            grp = v.group
            if grp is None or not grp[0] <= k < grp[0] + grp[1]:
                v.group = grp = None
                K = min(self.group, v.K - k)
                if K > 1 and table and n > 0:
                    Pk, lk = prefix_fwd_table(st.buf, v.S, k, K, n, H, B * T, D, st.dtype)
                    v.group = grp = (k, K, n, Pk, lk)
                elif K > 1 and n + (st.null is not None) > 0:
                    Pk, lk = prefix_fwd(st.buf if n else None, n, st.null.contiguous() if st.null is not None
                                         else None, v.W[k:k + K], H, eps, B * T, D, st.dtype, ss=st.ss)
                    v.group = grp = (k, K, n, Pk, lk)
            if grp is not None:
                lo, P, lse_p = grp[2], grp[3][k - grp[0]], grp[4][k - grp[0]]
                if k == grp[0] + grp[1] - 1:
                    v.group = None  # the partials are transient
        out, scores, v.rtoken = _Read.apply(state.token, v.rtoken, query, norm_weight, Qr, Gr, st.null, extra, st,
                                            n, H, eps, return_weights, k, lo_new, k_next, lo, P, lse_p, table)
        if return_weights:
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            return out, torch.exp(scores - lse).view(B, T, H, -1)  # (B, T, H, N) fp32
        return out


def route_fused(sources: Tensor, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6,
                return_weights: bool = False):
    """Fused counterpart of ``route_reference`` (same signature): stacked sources (N, B, T, D)."""
    router = FusedRouter()
    st = router.init(sources[0], capacity=sources.shape[0])
    for s in sources[1:]:
        st = router.append(st, s)
    return router.read(st, query, norm_weight, num_heads, eps, return_weights=return_weights)
