"""Triton kernels of the depth-routing operation (see ``reference.py`` for the math).

One program handles ``BLOCK_T`` token positions and makes ONE pass over the
sources: the key RMSNorm, the per-head scores and the per-head online softmax
are fused with the weighted mix, so each source is read once per routing call.
A token's row of width D is viewed as a (HP, DHP) tile: H heads of D/H columns,
both padded to powers of two (masked), so D and D/H need not be powers of two.

Sources, in order:  [null (D,), broadcast over tokens]  +  buf[0..n_buf)  +  [extra (BT, D)].

Forward saves only ``lse`` (BT, H) fp32 (plus the output, which the next layer
keeps anyway); backward recomputes the norm and the scores from the sources.
Backward is deterministic (no atomics): source gradients go to a gradient buffer
``gacc`` (slot j belongs to buf[j]); slots below ``n_init`` are accumulated into
(read-modify-write by the one program owning those tokens), the others are
initialised by a plain store. Query / norm-weight / null gradients are written
as per-program partial sums and reduced by the caller.
"""
from __future__ import annotations

import os
from collections import Counter

import torch
import triton
import triton.language as tl

# Kernel launches per kernel name (tests use it to prove the fused path ran).
LAUNCHES: Counter = Counter()
# Tuned configuration per (kernel, shape / dtype key): after the first (autotuned) launch of a key, later
# launches call the JIT function directly with it, skipping the autotuner's per-call Python work (routing
# calls are many and small: at 100M a microbatch makes 49 of them, and per-call CPU time adds up).
_TUNED: dict = {}


def _launch(kernel, key: tuple, grid, args: tuple, kwargs: dict) -> int:
    """Launch an autotuned kernel; returns the BLOCK_T it ran with."""
    cfg = _TUNED.get(key)
    if cfg is not None:
        kernel.fn[grid](*args, **kwargs, **cfg.all_kwargs())
        return cfg.kwargs["BLOCK_T"]
    kernel[grid](*args, **kwargs)
    if hasattr(kernel.best_config, "all_kwargs") and hasattr(kernel, "fn"):  # else: always via the autotuner
        _TUNED[key] = kernel.best_config
    return kernel.best_config.kwargs["BLOCK_T"]


def _configs() -> list:
    """Launch configurations tried by the autotuner (one fixed one under the interpreter, or when
    MHAR_ROUTING_AUTOTUNE=0, e.g. for tests over many shapes)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("MHAR_ROUTING_AUTOTUNE") == "0":
        return [triton.Config({"BLOCK_T": 2}, num_warps=4)]
    return [triton.Config({"BLOCK_T": bt}, num_warps=nw) for bt in (1, 2, 4, 8) for nw in (2, 4, 8)]


def _prune(configs, named_args, **kwargs):
    """Keep tiles of 256..8192 fp32 elements and at most one warp per 64 elements."""
    row = kwargs.get("HP", named_args.get("HP")) * kwargs.get("DHP", named_args.get("DHP"))
    keep = [c for c in configs
            if 256 <= c.kwargs["BLOCK_T"] * row <= 8192 and c.num_warps * 32 * 2 <= c.kwargs["BLOCK_T"] * row]
    return keep or configs[:1]


_TUNE = dict(configs=_configs(), key=["D", "H", "HAS_NULL", "HAS_EXTRA"],
             prune_configs_by={"early_config_prune": _prune})


@triton.jit
def _fwd_update(x, w, m, l, acc, D, eps):
    """Online-softmax step for one source tile x (BLOCK_T, HP, DHP) fp32."""
    ss = tl.sum(tl.sum(x * x, axis=2), axis=1)  # (BLOCK_T,)
    r = 1.0 / tl.sqrt(ss / D + eps)
    s = tl.sum(x * w[None, :, :], axis=2) * r[:, None]  # (BLOCK_T, HP) scores
    m_new = tl.maximum(m, s)
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    l = l * alpha + p
    acc = acc * alpha[:, :, None] + p[:, :, None] * x
    return m_new, l, acc, s


@triton.autotune(**_TUNE)
@triton.jit
def _route_fwd_kernel(
    buf_ptr, null_ptr, extra_ptr, q_ptr, g_ptr, out_ptr, lse_ptr, score_ptr,
    n_buf, buf_stride, BT, D, H, DH, N_TOTAL, eps,
    HAS_NULL: tl.constexpr, HAS_EXTRA: tl.constexpr, STORE_SCORES: tl.constexpr,
    BLOCK_T: tl.constexpr, HP: tl.constexpr, DHP: tl.constexpr,
):
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
    hh = tl.arange(0, HP)
    col = hh[:, None] * DH + tl.arange(0, DHP)[None, :]  # (HP, DHP) column index
    cmask = (hh[:, None] < H) & (tl.arange(0, DHP)[None, :] < DH)
    tmask = tok < BT
    offs = tok.to(tl.int64)[:, None, None] * D + col[None, :, :]  # (BLOCK_T, HP, DHP)
    mask = tmask[:, None, None] & cmask[None, :, :]
    smask = tmask[:, None] & (hh[None, :] < H)  # (BLOCK_T, HP)
    soffs = tok.to(tl.int64)[:, None] * (H * N_TOTAL) + hh[None, :] * N_TOTAL

    w = tl.load(q_ptr + col, mask=cmask, other=0.0).to(tl.float32) * \
        tl.load(g_ptr + col, mask=cmask, other=0.0).to(tl.float32)  # (HP, DHP)
    m = tl.full((BLOCK_T, HP), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_T, HP), tl.float32)
    acc = tl.zeros((BLOCK_T, HP, DHP), tl.float32)
    j0 = 0
    if HAS_NULL:
        nv = tl.load(null_ptr + col, mask=cmask, other=0.0).to(tl.float32)
        x = tl.zeros((BLOCK_T, HP, DHP), tl.float32) + nv[None, :, :]
        m, l, acc, s = _fwd_update(x, w, m, l, acc, D, eps)
        if STORE_SCORES:
            tl.store(score_ptr + soffs, s, mask=smask)
        j0 = 1
    for j in range(0, n_buf):
        x = tl.load(buf_ptr + j * buf_stride + offs, mask=mask, other=0.0).to(tl.float32)
        m, l, acc, s = _fwd_update(x, w, m, l, acc, D, eps)
        if STORE_SCORES:
            tl.store(score_ptr + soffs + j0 + j, s, mask=smask)
    if HAS_EXTRA:
        x = tl.load(extra_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m, l, acc, s = _fwd_update(x, w, m, l, acc, D, eps)
        if STORE_SCORES:
            tl.store(score_ptr + soffs + j0 + n_buf, s, mask=smask)
    out = acc / l[:, :, None]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)
    lse = m + tl.log(l)
    tl.store(lse_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], lse, mask=smask)


@triton.jit
def _delta_step(x, w, dout, lse, D, eps):
    """a_h * <dout_h, x_h> for one source tile: summed over sources it is <dout_h, out_h> in fp32."""
    ss = tl.sum(tl.sum(x * x, axis=2), axis=1)
    r = 1.0 / tl.sqrt(ss / D + eps)
    s = tl.sum(x * w[None, :, :], axis=2) * r[:, None]
    return tl.exp(s - lse) * tl.sum(dout * x, axis=2)


@triton.jit
def _bwd_source(x, w, dout, delta, lse, D, eps):
    """Gradient of one source tile x, and its per-token contribution to dL/dw (w = q * g)."""
    ss = tl.sum(tl.sum(x * x, axis=2), axis=1)  # (BLOCK_T,)
    r = 1.0 / tl.sqrt(ss / D + eps)
    s = tl.sum(x * w[None, :, :], axis=2) * r[:, None]  # (BLOCK_T, HP)
    a = tl.exp(s - lse)  # routing weights
    dv = tl.sum(dout * x, axis=2)  # <dout_h, x_h>
    ds = a * (dv - delta)  # dL/dscore
    c = tl.sum(ds * s, axis=1) * r * r / D  # (BLOCK_T,) RMS term
    dsr = ds * r[:, None]
    dx = a[:, :, None] * dout + dsr[:, :, None] * w[None, :, :] - x * c[:, None, None]
    return dx, dsr[:, :, None] * x  # dx, per-token contribution to dL/dw (BLOCK_T, HP, DHP)


@triton.autotune(**_TUNE, restore_value=["gacc_ptr"])
@triton.jit
def _route_bwd_kernel(
    buf_ptr, null_ptr, extra_ptr, q_ptr, g_ptr, out_ptr, dout_ptr, lse_ptr,
    gacc_ptr, dextra_ptr, dw_part_ptr, dnull_part_ptr,
    n_buf, n_init, buf_stride, gacc_stride, BT, D, H, DH, eps,
    HAS_NULL: tl.constexpr, HAS_EXTRA: tl.constexpr, TWO_PASS: tl.constexpr,
    BLOCK_T: tl.constexpr, HP: tl.constexpr, DHP: tl.constexpr,
):
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    col = hh[:, None] * DH + tl.arange(0, DHP)[None, :]  # (HP, DHP)
    cmask = (hh[:, None] < H) & (tl.arange(0, DHP)[None, :] < DH)
    tmask = tok < BT
    offs = tok.to(tl.int64)[:, None, None] * D + col[None, :, :]
    mask = tmask[:, None, None] & cmask[None, :, :]
    smask = tmask[:, None] & (hh[None, :] < H)

    w = tl.load(q_ptr + col, mask=cmask, other=0.0).to(tl.float32) * \
        tl.load(g_ptr + col, mask=cmask, other=0.0).to(tl.float32)
    dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], mask=smask, other=0.0)
    # delta (BLOCK_T, HP) = <dout_h, out_h> = sum_j a_j <dout_h, x_j,h>. From the saved output when it is
    # fp32; otherwise (bf16 output) a first pass over the sources recomputes it in fp32, since the softmax
    # backward (dv - delta) cancels and a rounded output would dominate the query / norm gradients.
    if TWO_PASS:
        delta = tl.zeros((BLOCK_T, HP), tl.float32)
        if HAS_NULL:
            nv = tl.load(null_ptr + col, mask=cmask, other=0.0).to(tl.float32)
            delta += _delta_step(tl.zeros((BLOCK_T, HP, DHP), tl.float32) + nv[None, :, :], w, dout, lse, D, eps)
        for j in range(0, n_buf):
            x = tl.load(buf_ptr + j * buf_stride + offs, mask=mask, other=0.0).to(tl.float32)
            delta += _delta_step(x, w, dout, lse, D, eps)
        if HAS_EXTRA:
            x = tl.load(extra_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            delta += _delta_step(x, w, dout, lse, D, eps)
    else:
        out = tl.load(out_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        delta = tl.sum(dout * out, axis=2)
    dw = tl.zeros((BLOCK_T, HP, DHP), tl.float32)  # reduced over tokens once, at the end
    if HAS_NULL:
        nv = tl.load(null_ptr + col, mask=cmask, other=0.0).to(tl.float32)
        x = tl.zeros((BLOCK_T, HP, DHP), tl.float32) + nv[None, :, :]
        dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
        dw += dwj
        dnull = tl.sum(tl.where(mask, dx, 0.0), axis=0)  # (HP, DHP)
        tl.store(dnull_part_ptr + pid * D + col, dnull, mask=cmask)
    for j in range(0, n_buf):
        x = tl.load(buf_ptr + j * buf_stride + offs, mask=mask, other=0.0).to(tl.float32)
        dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
        dw += dwj
        gp = gacc_ptr + j * gacc_stride + offs
        if j < n_init:
            dx += tl.load(gp, mask=mask, other=0.0).to(tl.float32)
        tl.store(gp, dx.to(gacc_ptr.dtype.element_ty), mask=mask)
    if HAS_EXTRA:
        x = tl.load(extra_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
        dw += dwj
        tl.store(dextra_ptr + offs, dx.to(dextra_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_part_ptr + pid * D + col, tl.sum(dw, axis=0), mask=cmask)


def _tiles(D: int, H: int) -> tuple[int, int]:
    """(HP, DHP): heads and head width padded to powers of two."""
    return triton.next_power_of_2(H), triton.next_power_of_2(D // H)


def _check_index_range(buf: torch.Tensor | None) -> None:
    if buf is not None and buf.numel() >= 2**31:
        raise ValueError(f"fused routing: source buffer of {buf.numel()} elements needs 64-bit slot offsets "
                         "(limit 2**31); use a smaller microbatch or routing_impl='compile'")


def route_fwd(buf: torch.Tensor | None, n_buf: int, null: torch.Tensor | None, extra: torch.Tensor | None,
              query: torch.Tensor, norm_weight: torch.Tensor, H: int, eps: float, BT: int, D: int,
              out_dtype: torch.dtype, store_scores: bool = False):
    """Launch the forward kernel.

    buf: (cap, BT, D) contiguous (rows [0, n_buf) used) or None; null: (D,) or None;
    extra: (BT, D) contiguous or None. Returns out (BT, D), lse (BT, H) fp32,
    scores (BT, H, N_total) fp32 or None.
    """
    device = query.device
    _check_index_range(buf)
    n_total = n_buf + (null is not None) + (extra is not None)
    if n_total == 0:
        raise ValueError("routing needs at least one source")
    out = torch.empty(BT, D, device=device, dtype=out_dtype)
    lse = torch.empty(BT, H, device=device, dtype=torch.float32)
    scores = torch.empty(BT, H, n_total, device=device, dtype=torch.float32) if store_scores else None
    HP, DHP = _tiles(D, H)
    dummy = out
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    args = (buf if buf is not None else dummy, null if null is not None else dummy,
            extra if extra is not None else dummy, query, norm_weight, out, lse,
            scores if scores is not None else lse,
            n_buf, buf.stride(0) if buf is not None else 0, BT, D, H, D // H, n_total, eps)
    flags = dict(HAS_NULL=null is not None, HAS_EXTRA=extra is not None, STORE_SCORES=store_scores, HP=HP, DHP=DHP)
    key = ("fwd", D, H, *flags.values(), *(str(a.dtype) for a in args[:8]))
    _launch(_route_fwd_kernel, key, grid, args, flags)
    LAUNCHES["route_fwd"] += 1
    return out, lse, scores


def route_bwd(buf, n_buf: int, null, extra, query, norm_weight, out, dout, lse, gacc, n_init: int,
              H: int, eps: float, BT: int, D: int):
    """Launch the backward kernel. Writes/accumulates gacc[0:n_buf] in place.

    out: the saved fp32 output (BT, D), or None for the two-pass backward (recomputes <dout, out>).

    Returns dw (D,) fp32 (= dL/d(q*g)), dnull (D,) fp32 or None, dextra (BT, D) or None.
    """
    device = query.device
    HP, DHP = _tiles(D, H)
    n_prog_max = BT  # rows for the smallest BLOCK_T; the tuned launch uses the first cdiv(BT, BLOCK_T)
    dw_part = torch.empty(n_prog_max, D, device=device, dtype=torch.float32)
    any_t = dout
    dnull_part = torch.empty(n_prog_max, D, device=device, dtype=torch.float32) if null is not None else None
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    dextra = torch.empty_like(extra) if extra is not None else None
    args = (buf if buf is not None else any_t, null if null is not None else any_t,
            extra if extra is not None else any_t, query, norm_weight, out if out is not None else any_t, dout, lse,
            gacc if gacc is not None else dw_part, dextra if dextra is not None else any_t, dw_part,
            dnull_part if dnull_part is not None else dw_part,
            n_buf, n_init, buf.stride(0) if buf is not None else 0, gacc.stride(0) if gacc is not None else 0,
            BT, D, H, D // H, eps)
    flags = dict(HAS_NULL=null is not None, HAS_EXTRA=extra is not None, TWO_PASS=out is None, HP=HP, DHP=DHP)
    key = ("bwd", D, H, *flags.values(), *(str(a.dtype) for a in args[:12]))
    block_t = _launch(_route_bwd_kernel, key, grid, args, flags)
    LAUNCHES["route_bwd"] += 1
    n_prog = triton.cdiv(BT, block_t)  # programs of the config just launched
    dnull = dnull_part[:n_prog].sum(0) if dnull_part is not None else None
    return dw_part[:n_prog].sum(0), dnull, dextra
