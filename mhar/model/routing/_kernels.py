"""Triton kernels of the depth-routing operation (see ``reference.py`` for the math; ``fused.py`` for how the
router uses them).

Sources, in order:  [null (D,), broadcast over tokens]  +  buf[0..n_buf)  +  [extra (BT, D)].

A program handles ``BLOCK_T`` token rows. A row of width D is held as H heads of D/H columns; most kernels split
each head into two power-of-two parts (``_split``: 160 = 128 + 32), so head widths that are not powers of two
leave no lanes idle. Softmax statistics and accumulations are fp32. Everything is deterministic (no atomics):
per-program partial sums are reduced by the caller in a fixed order.

Forward: ``route_fwd`` (a read that scores its sources: one online-softmax pass, optionally continuing a prefix
partial), ``score_sources`` (a source's scores for every announced read, into the score table),
``route_fwd_table`` (a read from the table), ``prefix_fwd`` / ``prefix_fwd_table`` (K reads' partials over their common
prefix in one pass). Backward: ``stash`` (keep a read's dout and <dout, out>), ``source_bwd`` (one source's
gradient from all its reads' douts, once), ``source_group_bwd`` (partial gradients of consecutive sources in one
pass), ``dW_all`` (the queries' and key norms' gradients in one matmul), ``route_bwd`` (a read's own backward over
its sources, for reads nobody announced and transient sources).
"""
from __future__ import annotations

import os
from collections import Counter

import torch
import triton
import triton.language as tl

from mhar.model.routing.names import PDL_ENV, autotune, check_kernel_env

# Kernel launches per kernel name (tests use it to prove the fused path ran).
LAUNCHES: Counter = Counter()
# Tuned configuration per (kernel, shape / dtype key): after the first (autotuned) launch of a key, later
# launches call the JIT function directly with it, skipping the autotuner's per-call Python work (routing
# calls are many and small: at 100M a microbatch makes 49 of them, and per-call CPU time adds up).
_TUNED: dict = {}


# Programmatic dependent launch (sm_90+; on by default, MHAR_ROUTING_PDL=0 turns it off): the kernels of
# ``_PDL_KERNELS`` are launched with CUDA's programmatic stream serialization and begin with ``_pdl_enter``: wait
# until the previous kernel has completed (griddepcontrol.wait: all its writes visible), then let the next kernel
# launch, so the next launch and its block scheduling overlap this kernel's tail (the routing makes hundreds of
# small launches per microbatch). Results are bit-identical to serial launches, eager or in a CUDA graph
# (tests/model/test_fused_routing.py). Never on the CPU, under the interpreter or before sm_90.
_PDL_ON: dict = {}


def triton_has_pdl() -> bool:
    """Whether this Triton can launch with programmatic dependent launch (``launch_pdl``, ``gdc_wait``: 3.4+)."""
    cuda = getattr(getattr(tl, "extra", None), "cuda", None)
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def pdl_enabled(device: torch.device) -> bool:
    """Whether routing kernels on ``device`` are launched with programmatic dependent launch: on a CUDA device of
    compute capability 9.0 or later with a Triton that has it (3.4+), not under the interpreter, unless
    ``MHAR_ROUTING_PDL=0`` (unset or 1: on where supported; 1 with a Triton without it is an error)."""
    check_kernel_env()
    flag = os.environ.get(PDL_ENV, "").strip()
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or flag == "0":
        return False
    if not triton_has_pdl():
        if flag == "1":
            raise ValueError(f"{PDL_ENV}=1: this Triton ({triton.__version__}) has no programmatic dependent launch "
                             "(needs 3.4+); upgrade Triton or unset the variable")
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PDL_ON:
        _PDL_ON[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return _PDL_ON[idx]


def _pdl_kwargs(t: torch.Tensor) -> dict:
    """The launch arguments of a kernel with a ``PDL`` parameter for tensors on t's device."""
    on = pdl_enabled(t.device)
    return {"PDL": on, "launch_pdl": on} if on else {}


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def _launch(kernel, key: tuple, grid, args: tuple, kwargs: dict) -> int:
    """Launch an autotuned kernel; returns the BLOCK_T it ran with. A kernel with a ``PDL`` parameter is
    launched with programmatic dependent launch where ``pdl_enabled`` (its first tensor argument's device)."""
    if kernel in _PDL_KERNELS:
        kwargs = {**kwargs, **_pdl_kwargs(args[0])}
    cfg = _TUNED.get(key)
    if cfg is not None:
        kernel.fn[grid](*args, **kwargs, **cfg.all_kwargs())
        return cfg.kwargs["BLOCK_T"]
    kernel[grid](*args, **kwargs)
    if hasattr(kernel.best_config, "all_kwargs") and hasattr(kernel, "fn"):  # else: always via the autotuner
        _TUNED[key] = kernel.best_config
    return kernel.best_config.kwargs["BLOCK_T"]


def _loop_bucket(n: int, cap: int = 16) -> int:
    """Autotuning bucket of a kernel's loop length n (sources or reads): the power of two >= n, at most ``cap``.
    It is part of each loop kernel's autotuning key, so the configuration used by a long loop is timed on a
    long loop (the first launch of a forward reads one or two sources, where the pipeline depth makes no
    difference and the choice would be noise)."""
    return min(triton.next_power_of_2(max(n, 1)), cap)


def _configs() -> list:
    """Launch configurations of ``route_bwd`` tried by the autotuner (one fixed one without autotuning:
    ``names.autotune``). PREFETCH: the loads of source j + 1 issued before the math of source j."""
    if not autotune():
        return [triton.Config({"BLOCK_T": 2, "PREFETCH": True}, num_warps=4)]
    return [triton.Config({"BLOCK_T": bt, "PREFETCH": pf}, num_warps=nw)
            for bt in (1, 2, 4, 8) for nw in (2, 4, 8) for pf in (True, False)]


def _keep_tiles(configs, row: int, most: int) -> list:
    """The configurations whose tile (BLOCK_T rows of ``row`` fp32 elements) has 256..``most`` elements and at
    least 64 per warp (else the first)."""
    keep = [c for c in configs
            if 256 <= c.kwargs["BLOCK_T"] * row <= most and c.num_warps * 32 * 2 <= c.kwargs["BLOCK_T"] * row]
    return keep or configs[:1]


def _arg(named_args, kwargs, name, default=None):
    return kwargs.get(name, named_args.get(name, default))


def _prune(configs, named_args, **kwargs):
    """Tiles (BLOCK_T, HP, DHP): 256..8192 elements, at least 64 per warp."""
    return _keep_tiles(configs, _arg(named_args, kwargs, "HP") * _arg(named_args, kwargs, "DHP"), 8192)


_TUNE = dict(configs=_configs(), key=["D", "H", "HAS_NULL", "HAS_EXTRA"],
             prune_configs_by={"early_config_prune": _prune})


@triton.jit
def _in(i, a, b, BLOCK_T: tl.constexpr):
    """(BLOCK_T, 1, 1) mask: a <= i < b (a scalar condition as a tensor, for masks)."""
    v = tl.full((BLOCK_T, 1, 1), i, tl.int32)
    return (v >= a) & (v < b)


@triton.jit
def _part(tok, hh, tmask, H, DH, D, OFF: tl.constexpr, W: tl.constexpr):
    """Columns OFF .. OFF + W - 1 of each head (masked to the head width DH) of the token rows ``tok``:
    col / cmask (HP, W), offs / mask (BLOCK_T, HP, W) into a (BT, D) tensor."""
    c = OFF + tl.arange(0, W)
    col = hh[:, None] * DH + c[None, :]
    cmask = (hh[:, None] < H) & (c[None, :] < DH)
    offs = tok.to(tl.int64)[:, None, None] * D + col[None, :, :]
    return col, cmask, offs, tmask[:, None, None] & cmask[None, :, :]


@triton.jit
def _ld(ptr, offs, mask):
    return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _hdot(a, b):
    """Per-head dot products of (BLOCK_T, HP, W) tiles (b may broadcast): (BLOCK_T, HP)."""
    return tl.sum(a * b, axis=2)


@triton.jit
def _rms2(xa, xb, D, eps, DB: tl.constexpr):
    """1 / RMS of each row held as the two parts of ``_split`` (xb unused when DB == 0): (BLOCK_T,)."""
    sq = tl.sum(_hdot(xa, xa), axis=1)
    if DB > 0:
        sq += tl.sum(_hdot(xb, xb), axis=1)
    return 1.0 / tl.sqrt(sq / D + eps)


@triton.jit
def _step2(xa, xb, wa, wb, r, m, l, acca, accb, DB: tl.constexpr):
    """Online-softmax step for one source held as two parts (``_split``; the b part unused when DB == 0) with its
    1 / RMS r (BLOCK_T,): returns the new (m, l, acca, accb) and the scores (BLOCK_T, HP)."""
    s = _hdot(xa, wa[None, :, :])
    if DB > 0:
        s += _hdot(xb, wb[None, :, :])
    s = s * r[:, None]
    m_new = tl.maximum(m, s)
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    acca = acca * alpha[:, :, None] + p[:, :, None] * xa
    if DB > 0:
        accb = accb * alpha[:, :, None] + p[:, :, None] * xb
    return m_new, l * alpha + p, acca, accb, s


@triton.jit
def _row_tiles(pid, BT, D, H, DH, BLOCK_T: tl.constexpr, HP: tl.constexpr, DHP: tl.constexpr):
    """Indices of a program's BLOCK_T token rows, each viewed as ONE (HP, DHP) tile (H heads of DH columns,
    padded): tok (BLOCK_T,), hh (HP,), col (HP, DHP) column index, cmask (HP, DHP), tmask (BLOCK_T,), offs /
    mask (BLOCK_T, HP, DHP) into a (BT, D) tensor, smask (BLOCK_T, HP)."""
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    col, cmask, offs, mask = _part(tok, hh, tmask, H, DH, D, 0, DHP)
    return tok, hh, col, cmask, tmask, offs, mask, tmask[:, None] & (hh[None, :] < H)


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
    buf_ptr, null_ptr, extra_ptr, q_ptr, g_ptr, out_ptr, dout_ptr, lse_ptr, gacc_ptr, dextra_ptr, dw_part_ptr,
    dnull_part_ptr, n_buf, acc_lo, acc_hi, buf_stride, gacc_stride, BT, D, H, DH, eps,
    HAS_NULL: tl.constexpr, HAS_EXTRA: tl.constexpr,
    BLOCK_T: tl.constexpr, HP: tl.constexpr, DHP: tl.constexpr, PREFETCH: tl.constexpr,
):
    """One read's backward over all its sources: each buffered source's gradient into gacc (slots in
    [acc_lo, acc_hi) accumulated into, the others overwritten), the extra's into dextra, this program's part of
    dL/dw (w = q * g) and of the null's gradient into dw_part / dnull_part. A row is one padded (HP, DHP) tile."""
    pid = tl.program_id(0)
    tok, hh, col, cmask, tmask, offs, mask, smask = _row_tiles(pid, BT, D, H, DH, BLOCK_T, HP, DHP)
    w = tl.load(q_ptr + col, mask=cmask, other=0.0).to(tl.float32) * \
        tl.load(g_ptr + col, mask=cmask, other=0.0).to(tl.float32)
    dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], mask=smask, other=0.0)
    # delta (BLOCK_T, HP) = <dout_h, out_h> from the saved output (in bf16 the rounded output costs some accuracy in
    # the query / norm gradients, as in FlashAttention's backward)
    delta = tl.sum(dout * tl.load(out_ptr + offs, mask=mask, other=0.0).to(tl.float32), axis=2)
    dw = tl.zeros((BLOCK_T, HP, DHP), tl.float32)  # reduced over tokens once, at the end
    if HAS_NULL:
        nv = tl.load(null_ptr + col, mask=cmask, other=0.0).to(tl.float32)
        x = tl.zeros((BLOCK_T, HP, DHP), tl.float32) + nv[None, :, :]
        dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
        dw += dwj
        dnull = tl.sum(tl.where(mask, dx, 0.0), axis=0)  # (HP, DHP)
        tl.store(dnull_part_ptr + pid * D + col, dnull, mask=cmask)
    if PREFETCH:  # loads of source j + 1 and of its gradient slot (if accumulated) before the math of j
        x_next = tl.load(buf_ptr + offs, mask=mask & _in(0, 0, n_buf, BLOCK_T), other=0.0)
        g_next = tl.load(gacc_ptr + offs, mask=mask & _in(0, 0, n_buf, BLOCK_T) & _in(0, acc_lo, acc_hi, BLOCK_T),
                         other=0.0)
        for j in range(0, n_buf):
            x = x_next.to(tl.float32)
            g_prev = g_next.to(tl.float32)  # 0 where slot j is overwritten, not accumulated
            x_next = tl.load(buf_ptr + (j + 1) * buf_stride + offs, mask=mask & _in(j + 1, 0, n_buf, BLOCK_T), other=0.0)
            g_next = tl.load(gacc_ptr + (j + 1) * gacc_stride + offs,
                             mask=mask & _in(j + 1, 0, n_buf, BLOCK_T) & _in(j + 1, acc_lo, acc_hi, BLOCK_T), other=0.0)
            dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
            dw += dwj
            tl.store(gacc_ptr + j * gacc_stride + offs, (dx + g_prev).to(gacc_ptr.dtype.element_ty), mask=mask)
    else:
        for j in range(0, n_buf):
            x = tl.load(buf_ptr + j * buf_stride + offs, mask=mask, other=0.0).to(tl.float32)
            dx, dwj = _bwd_source(x, w, dout, delta, lse, D, eps)
            dw += dwj
            gp = gacc_ptr + j * gacc_stride + offs
            if (j >= acc_lo) & (j < acc_hi):
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


def _split(D: int, H: int) -> tuple[int, int, int]:
    """(HP, DA, DB): heads padded to a power of two; each head's DH = D / H columns as two power-of-two parts, DA
    the largest power of two <= DH and DB the rest padded (0 when DH is a power of two). One padded tile would
    leave 96 of 256 lanes idle at head width 160 (1B, H = 8); 160 = 128 + 32, 80 = 64 + 16 need no padding."""
    DH = D // H
    DA = 1 << (DH.bit_length() - 1)
    return triton.next_power_of_2(H), DA, (0 if DA == DH else triton.next_power_of_2(DH - DA))


def _prune_tiles(configs, named_args, **kwargs):
    """Tiles (BLOCK_T, HP, DA + DB): 256..8192 elements, at least 64 per warp."""
    return _keep_tiles(configs, _arg(named_args, kwargs, "HP") * (_arg(named_args, kwargs, "DA") +
                                                                   _arg(named_args, kwargs, "DB")), 8192)


def _check_index_range(buf: torch.Tensor | None) -> None:
    if buf is not None and buf.numel() >= 2**31:
        raise ValueError(f"fused routing: source buffer of {buf.numel()} elements needs 64-bit slot offsets "
                         "(limit 2**31); use a smaller microbatch or routing_impl='compile'")


def route_fwd(buf: torch.Tensor | None, ss: torch.Tensor | None, n_buf: int, null: torch.Tensor | None,
              extra: torch.Tensor | None, query: torch.Tensor, norm_weight: torch.Tensor, H: int, eps: float, BT: int,
              D: int, out_dtype: torch.dtype, store_scores: bool = False, lo: int = 0,
              init: torch.Tensor | None = None, init_lse: torch.Tensor | None = None,
              lse_out: torch.Tensor | None = None):
    """One read that scores its sources: a pass over buf[lo:n_buf) (after the null source, before ``extra``).

    buf: (cap, BT, D) contiguous or None; ss: the buffer's per-source sums of squares (cap, BT) fp32
    (``append_source``; required with buffered sources); null: (D,) or None; extra: (BT, D) contiguous or None;
    init / init_lse: a prefix partial (BT, D) / (BT, H) fp32 to continue from, or None; lse_out: a contiguous
    (BT, H) fp32 tensor to write the log-sum-exp into (default: a new one). Returns out (BT, D), lse (BT, H)
    fp32, scores (BT, H, N) fp32 or None (N = sources read by this call).
    """
    device = query.device
    _check_index_range(buf)
    n_total = max(n_buf - lo, 0) + (null is not None) + (extra is not None)
    if n_total + (init is not None) == 0:
        raise ValueError("routing needs at least one source")
    if n_buf > lo and ss is None:
        raise ValueError("route_fwd: buffered sources need their sums of squares (ss)")
    out = torch.empty(BT, D, device=device, dtype=out_dtype)
    lse = lse_out if lse_out is not None else torch.empty(BT, H, device=device, dtype=torch.float32)
    scores = torch.empty(BT, H, n_total, device=device, dtype=torch.float32) if store_scores else None
    dummy = out
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    nb = _loop_bucket(n_buf - lo)  # autotuning bucket of the source loop
    args = (buf if buf is not None else dummy, null if null is not None else dummy,
            extra if extra is not None else dummy, query, norm_weight, out, lse,
            scores if scores is not None else lse, init if init is not None else dummy,
            init_lse if init_lse is not None else lse, ss if ss is not None else lse,
            lo, n_buf, buf.stride(0) if buf is not None else 0, BT, D, H, D // H, n_total, eps, nb)
    flags = dict(HAS_NULL=null is not None, HAS_EXTRA=extra is not None, STORE_SCORES=store_scores,
                 HAS_INIT=init is not None)
    flags.update(zip(("HP", "DA", "DB"), _split(D, H)))
    key = ("route_fwd", D, H, nb, *flags.values(), *(str(a.dtype) for a in args[:9]))
    _launch(_route_fwd_kernel, key, grid, args, flags)
    LAUNCHES["route_fwd"] += 1
    return out, lse, scores


def route_bwd(buf, n_buf: int, null, extra, query, norm_weight, out, dout, lse, gacc, acc_range: tuple[int, int],
              H: int, eps: float, BT: int, D: int):
    """A read's own backward over buf[0:n_buf) (and the null / extra sources). Writes gacc[0:n_buf) in place:
    slots inside ``acc_range`` = [a, b) are accumulated into, the others overwritten. out: the read's saved
    output (BT, D). Returns dw (D,) fp32 (= dL/d(q*g)), dnull (D,) fp32 or None, dextra (BT, D) or None.
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
            extra if extra is not None else any_t, query, norm_weight, out, dout, lse,
            gacc if gacc is not None else dw_part, dextra if dextra is not None else any_t, dw_part,
            dnull_part if dnull_part is not None else dw_part,
            n_buf, acc_range[0], acc_range[1], buf.stride(0) if buf is not None else 0,
            gacc.stride(0) if gacc is not None else 0, BT, D, H, D // H, eps)
    flags = dict(HAS_NULL=null is not None, HAS_EXTRA=extra is not None, HP=HP, DHP=DHP)
    key = ("bwd", D, H, *flags.values(), *(str(a.dtype) for a in args[:12]))
    block_t = _launch(_route_bwd_kernel, key, grid, args, flags)
    LAUNCHES["route_bwd"] += 1
    n_prog = triton.cdiv(BT, block_t)  # programs of the config just launched
    dnull = dnull_part[:n_prog].sum(0) if dnull_part is not None else None
    return dw_part[:n_prog].sum(0), dnull, dextra


def _prefix_outputs(buf, n_buf: int, null, K: int, BT: int, D: int, H: int, device, out_dtype: torch.dtype):
    """Checked inputs and the outputs of a prefix kernel: K partials P (K, BT, D) and their lse (K, BT, H) fp32."""
    if n_buf + (null is not None) == 0:
        raise ValueError("prefix routing needs at least one source")
    _check_index_range(buf)
    return (torch.empty(K, BT, D, device=device, dtype=out_dtype),
            torch.empty(K, BT, H, device=device, dtype=torch.float32))


# The source-major, write-once backward. Reads keep their dout (``stash``: one copy into a dout buffer, and
# delta = <dout, out> per head); each source's gradient is formed ONCE, when its first reader's backward runs (every
# later read has run its backward by then), from all reads that saw it. The reads' query / norm gradients need a
# sum over sources: the gradient kernels write dsr = dL/dscore * rms^-1 per (read, token, head) into one
# (H, reads, sources x tokens) buffer, which the first read's backward contracts with all sources in ONE batched
# matmul (``dW_all``).


def _loop_configs(full: bool = False) -> list:
    """BLOCK_T x warps x software-pipeline stages of the loop kernels (their source / read loops are
    ``tl.range(..., num_stages=STAGES)``: the next tiles stream through shared memory by asynchronous copies).
    ``full``: every configuration, also without autotuning."""
    if not full and not autotune():
        return [triton.Config({"BLOCK_T": 2, "STAGES": 2}, num_warps=4)]
    return [triton.Config({"BLOCK_T": bt, "STAGES": ns}, num_warps=nw)
            for bt in (1, 2, 4) for nw in (4, 8) for ns in (2, 4)]


@triton.autotune(configs=_loop_configs(), key=["D", "H", "HAS_NULL", "HAS_EXTRA", "HAS_INIT", "NB"],
                 prune_configs_by={"early_config_prune": _prune_tiles})
@triton.jit
def _route_fwd_kernel(
    buf_ptr, null_ptr, extra_ptr, q_ptr, g_ptr, out_ptr, lse_ptr, score_ptr, init_ptr, init_lse_ptr, ss_ptr,
    lo, n_buf, buf_stride, BT, D: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, N_TOTAL, eps, NB,
    HAS_NULL: tl.constexpr, HAS_EXTRA: tl.constexpr, STORE_SCORES: tl.constexpr, HAS_INIT: tl.constexpr,
    BLOCK_T: tl.constexpr, HP: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, STAGES: tl.constexpr,
):
    """``route_fwd``: the key RMSNorm, per-head scores and per-head online softmax fused with the weighted mix in
    one pass over [null] + buf[lo:n_buf) + [extra], optionally continuing a prefix partial (HAS_INIT: m = its
    log-sum-exp, l = 1, acc = its mix). The buffered sources' loop is pipelined (``tl.range``) and their RMS is
    read from ss (cap, BT) fp32 (``append_source``). A row is ``_split``'s two tiles per head; per-head scores
    add the two parts."""
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    smask = tmask[:, None] & (hh[None, :] < H)
    soffs = tok.to(tl.int64)[:, None] * (H * N_TOTAL) + hh[None, :] * N_TOTAL
    cola, cma, offa, ma = _part(tok, hh, tmask, H, DH, D, 0, DA)
    wa = _ld(q_ptr, cola, cma) * _ld(g_ptr, cola, cma)
    colb, cmb, offb, mb, wb = cola, cma, offa, ma, wa  # (placeholders when DB == 0: never used)
    if DB > 0:
        colb, cmb, offb, mb = _part(tok, hh, tmask, H, DH, D, DA, DB)
        wb = _ld(q_ptr, colb, cmb) * _ld(g_ptr, colb, cmb)
    if HAS_INIT:  # a prefix partial to continue: m = its log-sum-exp, l = 1, acc = its normalised mix
        m = tl.load(init_lse_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], mask=smask, other=0.0)
        l = tl.full((BLOCK_T, HP), 1.0, tl.float32)
        acca = _ld(init_ptr, offa, ma)
        accb = acca
        if DB > 0:
            accb = _ld(init_ptr, offb, mb)
    else:
        m = tl.full((BLOCK_T, HP), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_T, HP), tl.float32)
        acca = tl.zeros((BLOCK_T, HP, DA), tl.float32)
        accb = acca
        if DB > 0:
            accb = tl.zeros((BLOCK_T, HP, DB), tl.float32)
    if HAS_NULL:  # the broadcast null source (D,) first, its score at column 0
        xa = tl.zeros((BLOCK_T, HP, DA), tl.float32) + _ld(null_ptr, cola, cma)[None, :, :]
        xb = xa
        if DB > 0:
            xb = tl.zeros((BLOCK_T, HP, DB), tl.float32) + _ld(null_ptr, colb, cmb)[None, :, :]
        m, l, acca, accb, s = _step2(xa, xb, wa, wb, _rms2(xa, xb, D, eps, DB), m, l, acca, accb, DB)
        if STORE_SCORES:
            tl.store(score_ptr + soffs, s, mask=smask)
        soffs += 1
    for j in tl.range(lo, n_buf, num_stages=STAGES):
        xa = _ld(buf_ptr + j * buf_stride, offa, ma)
        xb = xa
        if DB > 0:
            xb = _ld(buf_ptr + j * buf_stride, offb, mb)
        r = 1.0 / tl.sqrt(tl.load(ss_ptr + j * BT + tok, mask=tmask, other=1.0) / D + eps)
        m, l, acca, accb, s = _step2(xa, xb, wa, wb, r, m, l, acca, accb, DB)
        if STORE_SCORES:
            tl.store(score_ptr + soffs + j - lo, s, mask=smask)
    if HAS_EXTRA:  # the transient extra source last
        xa = _ld(extra_ptr, offa, ma)
        xb = xa
        if DB > 0:
            xb = _ld(extra_ptr, offb, mb)
        m, l, acca, accb, s = _step2(xa, xb, wa, wb, _rms2(xa, xb, D, eps, DB), m, l, acca, accb, DB)
        if STORE_SCORES:
            tl.store(score_ptr + soffs + n_buf - lo, s, mask=smask)
    tl.store(out_ptr + offa, (acca / l[:, :, None]).to(out_ptr.dtype.element_ty), mask=ma)
    if DB > 0:
        tl.store(out_ptr + offb, (accb / l[:, :, None]).to(out_ptr.dtype.element_ty), mask=mb)
    tl.store(lse_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], m + tl.log(l), mask=smask)


@triton.autotune(configs=[triton.Config({"BLOCK_T": 2}, num_warps=4)]
                 if not autotune()
                 else [triton.Config({"BLOCK_T": bt}, num_warps=nw) for bt in (2, 4, 8) for nw in (4, 8)],
                 key=["D"], prune_configs_by={"early_config_prune": _prune_tiles})
@triton.jit
def _append_kernel(src_ptr, dst_ptr, ss_ptr, BT, D, BLOCK_T: tl.constexpr, HP: tl.constexpr, DA: tl.constexpr,
                   DB: tl.constexpr, PDL: tl.constexpr = False):
    """dst = src (in dst's dtype) and ss = the sum of squares of each stored (rounded) row, fp32. A row is
    ``_split``'s two parts of one "head" of width D (HP = 1): D = 1280 is 1024 + 256, no idle lanes."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    _, _, offs, mask = _part(tok, hh, tmask, 1, D, D, 0, DA)
    x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    sq = tl.sum(_hdot(xf, xf), axis=1)
    if DB > 0:
        _, _, offs, mask = _part(tok, hh, tmask, 1, D, D, DA, DB)
        x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(dst_ptr.dtype.element_ty)
        tl.store(dst_ptr + offs, x, mask=mask)
        xf = x.to(tl.float32)
        sq += tl.sum(_hdot(xf, xf), axis=1)
    tl.store(ss_ptr + tok, sq, mask=tmask)


def append_source(src: torch.Tensor, dst: torch.Tensor, ss: torch.Tensor) -> None:
    """Copy a source (BT, D) contiguous into its buffer slot ``dst`` (BT, D) and write its per-token sum of
    squares ``ss`` (BT,) fp32 (of the values as stored), which the kernels read instead of reducing each
    row per read."""
    BT, D = dst.shape
    HP, DA, DB = _split(D, 1)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    _launch(_append_kernel, ("append", D, str(src.dtype), str(dst.dtype)), grid, (src, dst, ss, BT, D),
            dict(HP=HP, DA=DA, DB=DB))
    LAUNCHES["append"] += 1


@triton.autotune(configs=_loop_configs(), key=["D", "H", "IS_NULL", "HAS_INIT", "HAS_S", "HAS_CINIT", "JB"],
                 prune_configs_by={"early_config_prune": _prune_tiles})
@triton.jit
def _src_bwd_kernel(
    x_ptr, ss_ptr, dbuf_ptr, lse_ptr, delta_ptr, w_ptr, init_ptr, grad_ptr, dsr_ptr, s_ptr, cinit_ptr,
    k_lo, k_hi, BT, D: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, BTD, BTH, eps, JB, dsr_sh, dsr_sk,
    IS_NULL: tl.constexpr, HAS_INIT: tl.constexpr, HAS_S: tl.constexpr, HAS_CINIT: tl.constexpr,
    BLOCK_T: tl.constexpr, HP: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, STAGES: tl.constexpr,
    PDL: tl.constexpr = False):
    """Gradient of ONE source x (BT, D) (or the broadcast null vector (D,)) from reads k_lo..k_hi-1.

    Read k's dout is dbuf[k] (BT, D), its log-sum-exp lse[k] and <dout, out> delta[k] (BT, H) fp32, its
    w = q * g in w[k] (D,) fp32; ss (BT,) fp32: the source's sum of squares per token (as the forward used it;
    ignored for the null vector). Writes grad (BT, D) (= init + sum over reads; IS_NULL: per-program sums over
    tokens (n_prog, D)) and dsr[h, k - k_lo, t] = dL/dscore * rms^-1 (H, J, BT; strides dsr_sh, dsr_sk, 1) in
    dsr's dtype. The read loop is a ``tl.range`` loop (software-pipelined: the douts stream through shared
    memory) whose body reduces over each head's columns only (the RMS term is summed per head and reduced over
    heads once, after the loop). Rows are the two tiles of ``_split``. D, H and DH are compile-time constants
    (per model width, as is the autotuning key), so masks and address arithmetic fold: the loop is
    issue-bound."""
    _pdl_enter(PDL)
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    smask = tmask[:, None] & (hh[None, :] < H)
    cola, cma, offa, ma = _part(tok, hh, tmask, H, DH, D, 0, DA)
    colb, cmb, offb, mb = cola, cma, offa, ma  # (placeholders when DB == 0: never used)
    if DB > 0:
        colb, cmb, offb, mb = _part(tok, hh, tmask, H, DH, D, DA, DB)
    tok = tok.to(tl.int64)
    hoffs = tok[:, None] * H + hh[None, :]  # (BLOCK_T, HP) into (BT, H)
    doffs = hh[None, :] * dsr_sh + tok[:, None]  # into dsr (H, J, BT), read k_lo
    if IS_NULL:
        xa = tl.zeros((BLOCK_T, HP, DA), tl.float32) + _ld(x_ptr, cola, cma)[None, :, :]
        xb = xa
        if DB > 0:
            xb = tl.zeros((BLOCK_T, HP, DB), tl.float32) + _ld(x_ptr, colb, cmb)[None, :, :]
        r = _rms2(xa, xb, D, eps, DB)
    else:
        xa = _ld(x_ptr, offa, ma)
        xb = xa
        if DB > 0:
            xb = _ld(x_ptr, offb, mb)
        r = 1.0 / tl.sqrt(tl.load(ss_ptr + tok, mask=tmask, other=1.0) / D + eps)
    dxa = tl.zeros((BLOCK_T, HP, DA), tl.float32)
    dxb = dxa
    if DB > 0:
        dxb = tl.zeros((BLOCK_T, HP, DB), tl.float32)
    csum = tl.zeros((BLOCK_T, HP), tl.float32)  # per head, summed over reads: <dscore, score> (the RMS term)
    if HAS_CINIT:  # a source-group pass's part of it (with init = its part of the gradient)
        csum = tl.load(cinit_ptr + hoffs, mask=smask, other=0.0)
    for k in tl.range(k_lo, k_hi, num_stages=STAGES):
        da = _ld(dbuf_ptr + k * BTD, offa, ma)
        wa = tl.load(w_ptr + k * D + cola, mask=cma, other=0.0)  # (HP, DA) fp32
        sd = _hdot(da, xa)
        if HAS_S:  # the score from the table
            s = tl.load(s_ptr + k * BTH + hoffs, mask=smask, other=0.0)
        else:
            s = _hdot(xa, wa[None, :, :])
        db, wb = da, wa
        if DB > 0:
            db = _ld(dbuf_ptr + k * BTD, offb, mb)
            wb = tl.load(w_ptr + k * D + colb, mask=cmb, other=0.0)
            if not HAS_S:
                s += _hdot(xb, wb[None, :, :])
            sd += _hdot(db, xb)
        lse = tl.load(lse_ptr + k * BTH + hoffs, mask=smask, other=0.0)
        delta = tl.load(delta_ptr + k * BTH + hoffs, mask=smask, other=0.0)
        if not HAS_S:
            s = s * r[:, None]  # (BLOCK_T, HP) scores
        a = tl.exp(s - lse)  # routing weights of this source in read k
        ds = a * (sd - delta)  # dL/dscore
        csum += ds * s
        dsr = ds * r[:, None]
        dxa = dxa + a[:, :, None] * da  # two updates: one fused multiply-add each per element (one expression
        dxa = dxa + dsr[:, :, None] * wa[None, :, :]  # compiled to a multiply, a multiply-add and an add)
        if DB > 0:
            dxb = dxb + a[:, :, None] * db
            dxb = dxb + dsr[:, :, None] * wb[None, :, :]
        tl.store(dsr_ptr + doffs + (k - k_lo) * dsr_sk, dsr.to(dsr_ptr.dtype.element_ty), mask=smask)
    c = (tl.sum(csum, axis=1) * r * r / D)[:, None, None]
    _src_grad_out(dxa - xa * c, init_ptr, grad_ptr, pid, D, cola, cma, offa, ma, HAS_INIT, IS_NULL)
    if DB > 0:
        _src_grad_out(dxb - xb * c, init_ptr, grad_ptr, pid, D, colb, cmb, offb, mb, HAS_INIT, IS_NULL)


@triton.jit
def _src_grad_out(dx, init_ptr, grad_ptr, pid, D, col, cmask, offs, mask, HAS_INIT: tl.constexpr,
                  IS_NULL: tl.constexpr):
    """Store one tile of a source gradient (plus ``init``); the null vector's as this program's sum over tokens."""
    if HAS_INIT:
        dx += _ld(init_ptr, offs, mask)
    if IS_NULL:
        tl.store(grad_ptr + pid * D + col, tl.sum(tl.where(mask, dx, 0.0), axis=0), mask=cmask)
    else:
        tl.store(grad_ptr + offs, dx.to(grad_ptr.dtype.element_ty), mask=mask)


def _prune_group(configs, named_args, **kwargs):
    """Accumulator tiles (BLOCK_T, GP, DA + DB) fp32 of a source group: 256..16384 elements, 64+ per warp."""
    return _keep_tiles(configs, _arg(named_args, kwargs, "GP") * (_arg(named_args, kwargs, "DA") +
                                                                   _arg(named_args, kwargs, "DB")), 16384)


def _group_configs(full: bool = False) -> list:
    """BLOCK_T tokens (the batch dimension of the per-token dots) x warps x pipeline stages of the read loop."""
    if not full and not autotune():
        return [triton.Config({"BLOCK_T": 2, "STAGES": 2}, num_warps=4)]
    return [triton.Config({"BLOCK_T": bt, "STAGES": ns}, num_warps=nw)
            for bt, nw, ns in ((1, 4, 2), (2, 4, 2), (2, 8, 2), (4, 4, 1), (4, 4, 2), (4, 8, 2), (8, 4, 2), (8, 8, 2))]


@triton.jit
def _xdot(x, b, LOW: tl.constexpr, EMU: tl.constexpr):
    """x @ b for operands that are exact in their dtype: LOW (16-bit operands) one tensor-core dot with fp32
    accumulation (the products are exact in fp32); else, or under the interpreter (EMU: its 16-bit tl.dot is
    wrong), an fp32 dot of the same values."""
    if LOW and not EMU:
        return tl.dot(x, b)
    return tl.dot(x.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _adot(a, b, LOW: tl.constexpr, EMU: tl.constexpr):
    """a (fp32) @ b: LOW (b 16-bit) a as hi + lo parts in b's dtype, two tensor-core dots (a to ~2^-16
    relative); else / EMU an fp32 dot."""
    if LOW and not EMU:
        hi = a.to(b.dtype)
        return tl.dot(hi, b) + tl.dot((a - hi.to(tl.float32)).to(b.dtype), b)
    return tl.dot(a, b.to(tl.float32), input_precision="ieee")


@triton.jit
def _group_part_load(dbuf_ptr, wh_ptr, wl_ptr, drow, kk, dm, km, col, cm, D, LOW: tl.constexpr):
    """One column part (columns col, mask cm) of a chunk's douts (BLOCK_T, KC, C) and weights wh / wl (KC, C)
    (wl only when LOW; else wh again)."""
    d = tl.load(dbuf_ptr + drow + col[None, None, :], mask=dm[:, :, None] & cm[None, None, :], other=0.0)
    wm = km[:, None] & cm[None, :]
    wh = tl.load(wh_ptr + kk[:, None] * D + col[None, :], mask=wm, other=0.0)
    wl = wh
    if LOW:
        wl = tl.load(wl_ptr + kk[:, None] * D + col[None, :], mask=wm, other=0.0)
    return d, wh, wl


@triton.jit
def _group_part_sd(x, d, LOW: tl.constexpr, EMU: tl.constexpr):
    """x . dout (BLOCK_T, GP, KC) fp32 of one column part."""
    return _xdot(x, tl.permute(d, (0, 2, 1)), LOW, EMU)


@triton.jit
def _group_part_scores(x, d, wh, wl, BLOCK_T: tl.constexpr, GP: tl.constexpr, KC: tl.constexpr,
                       LOW: tl.constexpr, EMU: tl.constexpr):
    """One column part of a head: x (BLOCK_T, GP, C) the group's sources, d (BLOCK_T, KC, C) the reads' douts,
    wh / wl (KC, C) their weights (hi / lo in the sources' dtype; wl unused unless LOW). Returns the raw scores
    x . w (BLOCK_T, GP, KC) (``_sdot``) and x . dout (BLOCK_T, GP, KC), fp32."""
    s = _sdot(tl.reshape(x, (BLOCK_T * GP, x.shape[2])), tl.trans(wh), tl.trans(wl), LOW, True, EMU)
    return tl.reshape(s, (BLOCK_T, GP, KC)), _group_part_sd(x, d, LOW, EMU)


@triton.jit
def _group_part_update(acc, a, dsr, d, wh, wl, BLOCK_T: tl.constexpr, GP: tl.constexpr, LOW: tl.constexpr,
                       EMU: tl.constexpr):
    """acc (BLOCK_T, GP, C) += a @ dout (per token) + dsr @ w (weights shared by the tokens)."""
    C: tl.constexpr = acc.shape[2]
    dsr2 = tl.reshape(dsr, (BLOCK_T * GP, dsr.shape[2]))
    dw = _adot(dsr2, wh, LOW, EMU)
    if LOW:
        dw += _xdot(dsr2.to(wl.dtype), wl, LOW, EMU)
    return acc + _adot(a, d, LOW, EMU) + tl.reshape(dw, (BLOCK_T, GP, C))


@triton.autotune(configs=_group_configs(), key=["D", "H", "GP", "LOW", "JB"],
                 prune_configs_by={"early_config_prune": _prune_group})
@triton.jit
def _src_group_bwd_kernel(
    x_ptr, ss_ptr, dbuf_ptr, lse_ptr, delta_ptr, wh_ptr, wl_ptr, part_ptr, cpart_ptr, dsr_ptr,
    NG, k_lo, k_hi, BT, D: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, BTD, BTH, eps, dsr_sh, dsr_sk,
    JB, GP: tl.constexpr, KC: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, LOW: tl.constexpr,
    EMU: tl.constexpr, BLOCK_T: tl.constexpr, STAGES: tl.constexpr,
    PDL: tl.constexpr = False):
    """Partial gradients of NG <= GP CONSECUTIVE buffered sources (x: the first; slots BTD apart, ss their sums of
    squares (NG, BT) fp32) from reads k_lo..k_hi-1, in ONE pass over those reads' douts (dbuf[k] (BT, D)): one
    program per (token block, head); the reads in chunks of KC. Per token the group's sources and a chunk's
    douts are small matrices, so everything that is per element is a tensor-core dot (fp32 accumulation):
    scores x . w_k (w = q g as hi + lo parts: fp32 accuracy), x . dout_k, and the updates a @ dout + dsr @ w (a
    and dsr as hi + lo parts); the CUDA cores do only per-(token, source, read) work. Writes part (NG, BT, D) fp32
    = sum over these reads of a * dout + dsr * w (WITHOUT the RMS term, which needs all heads), cpart (NG, BT, H)
    fp32 = per head the sum of dscore * score (the RMS term's factor) and dsr[h, k, g * BT + t] = dL/dscore *
    rms^-1 (strides dsr_sh, dsr_sk, 1; dsr's dtype). ``source_bwd(init=part, cinit=cpart)`` completes each
    source (its earlier reads and the RMS term). A head's columns are ``_split``'s two parts (DA, DB)."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    tmask = tok < BT
    tok64 = tok.to(tl.int64)
    gg = tl.arange(0, GP)
    tg = tmask[:, None] & (gg < NG)[None, :]  # (BLOCK_T, GP)
    xrow = gg.to(tl.int64)[None, :] * BTD + tok64[:, None] * D  # (BLOCK_T, GP): row starts in x / part
    r = 1.0 / tl.sqrt(tl.load(ss_ptr + gg[None, :] * BT + tok[:, None], mask=tg, other=1.0) / D + eps)
    ca = tl.arange(0, DA)
    cam = ca < DH  # (DA may exceed a narrow head: the dots need 16 columns)
    ca = h * DH + ca
    xa = tl.load(x_ptr + xrow[:, :, None] + ca[None, None, :], mask=tg[:, :, None] & cam[None, None, :], other=0.0)
    acca = tl.zeros((BLOCK_T, GP, DA), tl.float32)
    cb, cbm, xb, accb = ca, cam, xa, acca  # (placeholders when DB == 0: never used)
    if DB > 0:
        cb = DA + tl.arange(0, DB)
        cbm = cb < DH
        cb = h * DH + cb
        xb = tl.load(x_ptr + xrow[:, :, None] + cb[None, None, :], mask=tg[:, :, None] & cbm[None, None, :],
                     other=0.0)
        accb = tl.zeros((BLOCK_T, GP, DB), tl.float32)
    csum = tl.zeros((BLOCK_T, GP), tl.float32)
    kc = tl.arange(0, KC)
    hoffs = tok64[:, None] * H + h  # (BLOCK_T, 1) into (BT, H)
    doffs = h * dsr_sh + gg[None, :, None] * BT + tok64[:, None, None]  # (BLOCK_T, GP, 1) into dsr
    for k0 in tl.range(k_lo, k_hi, KC, num_stages=STAGES):
        kk = (k0 + kc).to(tl.int64)
        km = kk < k_hi
        dm = tmask[:, None] & km[None, :]  # (BLOCK_T, KC)
        drow = kk[None, :, None] * BTD + tok64[:, None, None] * D  # (BLOCK_T, KC, 1)
        da, wh_a, wl_a = _group_part_load(dbuf_ptr, wh_ptr, wl_ptr, drow, kk, dm, km, ca, cam, D, LOW)
        s, sd = _group_part_scores(xa, da, wh_a, wl_a, BLOCK_T, GP, KC, LOW, EMU)
        db, wh_b, wl_b = da, wh_a, wl_a
        if DB > 0:
            db, wh_b, wl_b = _group_part_load(dbuf_ptr, wh_ptr, wl_ptr, drow, kk, dm, km, cb, cbm, D, LOW)
            s_b, sd_b = _group_part_scores(xb, db, wh_b, wl_b, BLOCK_T, GP, KC, LOW, EMU)
            s += s_b
            sd += sd_b
        s = s * r[:, :, None]
        lse = tl.load(lse_ptr + kk[None, :] * BTH + hoffs, mask=dm, other=0.0)
        delta = tl.load(delta_ptr + kk[None, :] * BTH + hoffs, mask=dm, other=0.0)
        a = tl.where(km[None, None, :], tl.exp(s - lse[:, None, :]), 0.0)  # (BLOCK_T, GP, KC) routing weights
        ds = a * (sd - delta[:, None, :])  # dL/dscore
        csum += tl.sum(ds * s, axis=2)
        dsr = ds * r[:, :, None]
        tl.store(dsr_ptr + doffs + kk[None, None, :] * dsr_sk, dsr.to(dsr_ptr.dtype.element_ty),
                 mask=tg[:, :, None] & km[None, None, :])
        acca = _group_part_update(acca, a, dsr, da, wh_a, wl_a, BLOCK_T, GP, LOW, EMU)
        if DB > 0:
            accb = _group_part_update(accb, a, dsr, db, wh_b, wl_b, BLOCK_T, GP, LOW, EMU)
    tl.store(part_ptr + xrow[:, :, None] + ca[None, None, :], acca, mask=tg[:, :, None] & cam[None, None, :])
    if DB > 0:
        tl.store(part_ptr + xrow[:, :, None] + cb[None, None, :], accb, mask=tg[:, :, None] & cbm[None, None, :])
    tl.store(cpart_ptr + gg[None, :] * BTH + hoffs, csum, mask=tg)


def source_group_bwd(buf: torch.Tensor, ss: torch.Tensor, s0: int, NG: int, dbuf: torch.Tensor, lse: torch.Tensor,
                     delta: torch.Tensor, W_split: tuple, k_lo: int, k_hi: int, dsr_all: torch.Tensor, H: int,
                     eps: float, BT: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial gradients of buffered sources s0..s0+NG-1 from reads k_lo..k_hi-1 in ONE pass over those reads'
    douts (``_src_group_bwd_kernel``). W_split: ``split_weights(W, buf.dtype)``; dsr_all: the (H, K, cap * BT)
    dL/dscore buffer of ``dW_all`` (this pass writes its slots' columns for these reads). Returns (parts
    (NG, BT, D) fp32, cparts (NG, BT, H) fp32); complete source g with ``source_bwd(init=parts[g],
    cinit=cparts[g])`` over its reads before k_lo (none for the newest: an empty range)."""
    dev = buf.device
    if dbuf.numel() >= 2**31 or buf.numel() >= 2**31 or dsr_all.numel() >= 2**31:
        raise ValueError("fused routing: buffers need 64-bit offsets (limit 2**31); use a smaller microbatch or "
                         "routing_impl='compile'")
    if dsr_all.stride(2) != 1 or dsr_all.dtype != buf.dtype:
        raise ValueError("source_group_bwd: dsr_all must be (H, K, cap * BT) with unit token stride in the "
                         "buffer's dtype")
    wh, wl = W_split
    parts = torch.empty(NG, BT, D, device=dev, dtype=torch.float32)
    cparts = torch.empty(NG, BT, H, device=dev, dtype=torch.float32)
    _, DA, DB = _split(D, H)
    if DA < 16 or 0 < DB < 16:  # the dots reduce over at least 16 columns: one masked part
        DA, DB = max(16, triton.next_power_of_2(D // H)), 0
    gp = max(triton.next_power_of_2(NG), 2)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]), H)  # noqa: E731
    dsr = dsr_all[:, :, s0 * BT:]
    jb = _loop_bucket(-(-(k_hi - k_lo) // 16), 4)  # autotuning bucket: chunks of 16 reads
    args = (buf[s0], ss[s0], dbuf, lse, delta, wh, wl if wl is not None else wh, parts, cparts, dsr,
            NG, k_lo, k_hi, BT, D, H, D // H, BT * D, BT * H, eps, dsr.stride(0), dsr.stride(1), jb)
    flags = dict(GP=gp, KC=16, DA=DA, DB=DB, LOW=wl is not None, EMU=os.environ.get("TRITON_INTERPRET") == "1")
    key = ("src_group_bwd", D, H, gp, jb, *flags.values(), *(str(a.dtype) for a in args[:10]))
    _launch(_src_group_bwd_kernel, key, grid, args, flags)
    LAUNCHES["source_group_bwd"] += 1
    return parts, cparts


@triton.autotune(configs=[triton.Config({"BLOCK_T": 2}, num_warps=4)]
                 if not autotune()
                 else [triton.Config({"BLOCK_T": bt}, num_warps=nw) for bt in (2, 4, 8, 16) for nw in (4, 8)],
                 key=["D", "H"], prune_configs_by={"early_config_prune": _prune_tiles})
@triton.jit
def _stash_kernel(dout_ptr, out_ptr, dslot_ptr, delta_ptr, BT, D, H, DH,
                  BLOCK_T: tl.constexpr, HP: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
                  PDL: tl.constexpr = False):
    """dslot = dout (in the dout buffer's dtype) and delta = <dout_h, out_h> (BT, H) fp32 (rows as ``_split``)."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    _, _, offs, mask = _part(tok, hh, tmask, H, DH, D, 0, DA)
    dout = tl.load(dout_ptr + offs, mask=mask, other=0.0)
    tl.store(dslot_ptr + offs, dout.to(dslot_ptr.dtype.element_ty), mask=mask)
    delta = _hdot(dout.to(tl.float32), _ld(out_ptr, offs, mask))
    if DB > 0:
        _, _, offs, mask = _part(tok, hh, tmask, H, DH, D, DA, DB)
        dout = tl.load(dout_ptr + offs, mask=mask, other=0.0)
        tl.store(dslot_ptr + offs, dout.to(dslot_ptr.dtype.element_ty), mask=mask)
        delta += _hdot(dout.to(tl.float32), _ld(out_ptr, offs, mask))
    tl.store(delta_ptr + tok.to(tl.int64)[:, None] * H + hh[None, :], delta, mask=tmask[:, None] & (hh[None, :] < H))


def stash(dout: torch.Tensor, out: torch.Tensor, dslot: torch.Tensor, delta: torch.Tensor, H: int, BT: int,
          D: int) -> None:
    """Copy a read's dout (BT, D) into its dout-buffer slot and write delta (BT, H) fp32 = <dout, out> per head."""
    HP, DA, DB = _split(D, H)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    args = (dout, out, dslot, delta, BT, D, H, D // H)
    _launch(_stash_kernel, ("stash", D, H, str(dout.dtype), str(out.dtype), str(dslot.dtype)), grid, args,
            dict(HP=HP, DA=DA, DB=DB))
    LAUNCHES["stash"] += 1


def source_bwd(x: torch.Tensor, is_null: bool, dbuf: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
               w: torch.Tensor, k_lo: int, k_hi: int, init: torch.Tensor | None, grad_dtype: torch.dtype,
               H: int, eps: float, BT: int, D: int, ss: torch.Tensor | None = None,
               scores: torch.Tensor | None = None, dsr_out: torch.Tensor | None = None,
               cinit: torch.Tensor | None = None):
    """Write-once gradient of one source from reads k_lo..k_hi-1 (dbuf / lse / delta / w: (K, ...) buffers).

    x: the source (BT, D) contiguous, or the null vector (D,) with ``is_null``; ss: its per-token sum of
    squares (BT,) fp32 (``append_source``; required unless ``is_null``); init: a gradient (BT, D) to
    add (the accumulation of reads nobody announced), or None; scores: the source's score table (K, BT, H) fp32 (
    ``score_sources``; rows k_lo..k_hi-1 used) instead of recomputing each score. Returns (grad, dW): grad (BT, D) in ``grad_dtype`` ((D,)
    fp32 for the null source), dW (H, k_hi - k_lo, D / H) (x's dtype; fp32 for the null source) = this source's
    part of dL/d(q_k * g_k), head-major. dsr_out (buffered sources): an (H, J, BT) view (unit stride over
    tokens, e.g. a slice of one tensor for all sources, ``dW_all``) to write dL/dscore * rms^-1 into instead of
    contracting it here: dW is then None (the caller contracts all sources in one matmul). cinit (with init):
    a source-group pass's part (``source_group_bwd``) of the per-head sums that the RMS term needs; the range
    k_lo..k_hi-1 may then be empty (the group's pass covered every read)."""
    J = k_hi - k_lo
    dev = x.device
    if dbuf.numel() >= 2**31 or H * J * BT >= 2**31:
        raise ValueError(f"fused routing: dout buffer of {dbuf.numel()} elements needs 64-bit offsets (limit 2**31); "
                         "use a smaller microbatch or routing_impl='compile'")
    # dsr in the source's dtype, the dtype of the dW matmul (fp32 for the null vector, summed over tokens here)
    if dsr_out is not None and (is_null or dsr_out.shape != (H, J, BT) or dsr_out.stride(2) != 1
                                or dsr_out.dtype != x.dtype):
        raise ValueError("source_bwd: dsr_out must be an (H, J, BT) view with unit token stride in the source's dtype")
    dsr = dsr_out if dsr_out is not None else torch.empty(H, J, BT, device=dev,
                                                          dtype=torch.float32 if is_null else x.dtype)
    grad = (torch.empty(BT, D, device=dev, dtype=torch.float32) if is_null  # per-program rows, max BT programs
            else torch.empty(BT, D, device=dev, dtype=grad_dtype))
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    jb = _loop_bucket(J)  # autotuning bucket of the number of reads
    if ss is None and not is_null:
        raise ValueError("source_bwd: a buffered source needs its sums of squares (ss)")
    if cinit is not None and (init is None or is_null or cinit.shape != (BT, H) or cinit.dtype != torch.float32):
        raise ValueError("source_bwd: cinit (BT, H) fp32 comes with init (a source-group pass's part)")
    args = (x, ss if ss is not None else dsr, dbuf, lse, delta, w, init if init is not None else grad, grad, dsr,
            scores if scores is not None else lse, cinit if cinit is not None else lse, k_lo, k_hi, BT, D, H, D // H,
            BT * D, BT * H, eps, jb, dsr.stride(0), dsr.stride(1))
    HP, DA, DB = _split(D, H)
    flags = dict(IS_NULL=is_null, HAS_INIT=init is not None, HAS_S=scores is not None, HAS_CINIT=cinit is not None,
                 HP=HP, DA=DA, DB=DB)
    key = ("src_bwd", D, H, jb, *flags.values(), *(str(a.dtype) for a in args[:8]))
    block_t = _launch(_src_bwd_kernel, key, grid, args, flags)
    LAUNCHES["source_bwd"] += 1
    DH = D // H
    if is_null:
        grad = grad[:triton.cdiv(BT, block_t)].sum(0)
        return grad, dsr.sum(-1)[:, :, None] * x.float().view(H, 1, DH)  # (H, J, DH)
    return grad, (_dW(dsr, x, H) if dsr_out is None else None)


def dW_all(dsr_all: torch.Tensor, buf: torch.Tensor, n: int, H: int) -> torch.Tensor:
    """All buffered sources' part of dL/d(q_k * g_k) in ONE batched matmul (instead of one per source):
    dsr_all (H, K, cap * BT) in the buffer's dtype holds each source's dL/dscore * rms^-1 for the reads that saw
    it (zeros elsewhere; ``source_bwd(dsr_out=...)``), buf (cap, BT, D) the sources; slots 0..n-1 are used (the
    others may hold anything). Returns (H, K, D / H) fp32: dW[h, k] = sum over slots j and tokens t of
    dsr_all[h, k, j * BT + t] * buf[j, t, h]."""
    cap, BT, D = buf.shape
    xv = buf[:n].reshape(n * BT, H, D // H).transpose(0, 1)  # (H, n * BT, DH), strided
    return torch.bmm(dsr_all[:, :, :n * BT], xv).float()


def _dW(dsr: torch.Tensor, x: torch.Tensor, H: int) -> torch.Tensor:
    """One source's part of dL/d(q_k * g_k) for the J reads of ``dsr`` (H, J, BT): dW[h, k] = sum_t
    dsr[h, k, t] x[t, h], a batched matmul over tokens, one batch per head, in x's dtype (fp32 accumulation
    inside the matmul; the gradient kernels write dsr in it). x: (BT, D). Returns (H, J, DH) (head-major: the
    caller adds it into an (H, K, DH) fp32 accumulator with no transposing copy)."""
    BT, D = x.shape
    xv = x.view(BT, H, D // H).transpose(0, 1)  # (H, BT, DH)
    return torch.bmm(dsr, xv)


# Forward prefix sharing without the score table (a null source, or a group opened by a read with an extra
# source): K announced reads share ONE pass over their common prefix: one program per (token block, head), the K
# reads a tile dimension, so each source's head slice is read once for all K, each read with its own
# w_k = q_k * g_k (``_prefix_fwd_kernel``). Outputs the normalised partial mix P_k and its log-sum-exp per read; each
# read then continues with its newer sources (route_fwd with init=...). The backward needs no partials.
def _prefix_configs(full: bool = False) -> list:
    if not full and not autotune():
        return [triton.Config({"BLOCK_T": 2, "STAGES": 2}, num_warps=2)]
    return [triton.Config({"BLOCK_T": bt, "STAGES": ns}, num_warps=nw) for bt in (1, 2, 4, 8) for nw in (2, 4, 8)
            for ns in (2, 4)]


def _prune_prefix(configs, named_args, **kwargs):
    """Tiles (KP, BLOCK_T, DHP) of one head: 256..8192 elements, at least 64 per warp."""
    return _keep_tiles(configs, _arg(named_args, kwargs, "KP") * _arg(named_args, kwargs, "DHP"), 8192)


@triton.autotune(configs=_prefix_configs(), key=["D", "H", "K", "HAS_NULL", "NB"],
                 prune_configs_by={"early_config_prune": _prune_prefix})
@triton.jit
def _prefix_fwd_kernel(buf_ptr, null_ptr, w_ptr, p_ptr, lse_ptr, ss_ptr, n_buf, buf_stride, BT, D, H, DH, K, eps, NB,
                    HAS_NULL: tl.constexpr, BLOCK_T: tl.constexpr, KP: tl.constexpr, HP: tl.constexpr,
                    DHP: tl.constexpr, DP: tl.constexpr, STAGES: tl.constexpr):
    """K reads' partials over [null] + buf[0:n_buf) for ONE head (program axis 1) of BLOCK_T tokens: the reads
    are a leading tile dimension (KP, BLOCK_T, DHP), so each source's head slice is loaded once (pipelined
    through shared memory: ``tl.range``) for all K, each read with its own w_k. Every quantity is per head
    except the RMS over the whole row, which comes from ss (``append_source``), so a program holds K x one
    head, not K x D, per token."""
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    dd = tl.arange(0, DHP)
    col = h * DH + dd  # (DHP,)
    cmask = dd < DH
    tmask = tok < BT
    offs = tok.to(tl.int64)[:, None] * D + col[None, :]  # (BLOCK_T, DHP)
    mask = tmask[:, None] & cmask[None, :]
    kk = tl.arange(0, KP)
    kmask = kk < K
    w = tl.load(w_ptr + kk[:, None] * D + col[None, :], mask=kmask[:, None] & cmask[None, :], other=0.0)  # (KP, DHP)
    m = tl.full((KP, BLOCK_T), float("-inf"), tl.float32)
    l = tl.zeros((KP, BLOCK_T), tl.float32)
    acc = tl.zeros((KP, BLOCK_T, DHP), tl.float32)
    if HAS_NULL:
        nd = tl.arange(0, DP)
        nfull = tl.load(null_ptr + nd, mask=nd < D, other=0.0).to(tl.float32)
        rn = 1.0 / tl.sqrt(tl.sum(nfull * nfull, axis=0) / D + eps)
        nv = tl.load(null_ptr + col, mask=cmask, other=0.0).to(tl.float32)
        x = tl.zeros((BLOCK_T, DHP), tl.float32) + nv[None, :]
        m, l, acc = _head_update_reads(x, tl.full((BLOCK_T,), 1.0, tl.float32) * rn, w, m, l, acc)
    for j in tl.range(0, n_buf, num_stages=STAGES):
        x = tl.load(buf_ptr + j * buf_stride + offs, mask=mask, other=0.0).to(tl.float32)
        ssj = tl.load(ss_ptr + j * BT + tok, mask=tmask, other=1.0)
        m, l, acc = _head_update_reads(x, 1.0 / tl.sqrt(ssj / D + eps), w, m, l, acc)
    k64 = kk.to(tl.int64)
    tl.store(p_ptr + k64[:, None, None] * BT * D + offs[None, :, :], (acc / l[:, :, None]).to(p_ptr.dtype.element_ty),
             mask=kmask[:, None, None] & mask[None, :, :])
    tl.store(lse_ptr + k64[:, None] * BT * H + tok.to(tl.int64)[None, :] * H + h, m + tl.log(l),
             mask=kmask[:, None] & tmask[None, :])


@triton.jit
def _head_update_reads(x, r, w, m, l, acc):
    """Online-softmax step of K reads over one head's source tile x (BLOCK_T, DHP) fp32 with 1 / RMS r
    (BLOCK_T,): w (KP, DHP); m, l (KP, BLOCK_T); acc (KP, BLOCK_T, DHP)."""
    s = tl.sum(x[None, :, :] * w[:, None, :], axis=2) * r[None, :]
    m_new = tl.maximum(m, s)
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    return m_new, l * alpha + p, acc * alpha[:, :, None] + p[:, :, None] * x[None, :, :]


def prefix_fwd(buf, n_buf: int, null, W: torch.Tensor, H: int, eps: float, BT: int, D: int,
                out_dtype: torch.dtype, ss: torch.Tensor | None = None):
    """Partials of K reads (W = q * g, (K, D) fp32 contiguous) over [null] + buf[0:n_buf): P (K, BT, D) in
    ``out_dtype``, lse (K, BT, H) fp32. ss: the buffer's sums of squares (cap, BT) fp32 (required with
    buffered sources)."""
    K = W.shape[0]
    P, lse = _prefix_outputs(buf, n_buf, null, K, BT, D, H, W.device, out_dtype)
    HP, DHP = _tiles(D, H)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]), H)  # noqa: E731
    if n_buf and ss is None:
        raise ValueError("prefix_fwd: buffered sources need their sums of squares (ss)")
    nb = _loop_bucket(n_buf)
    args = (buf if buf is not None else P, null if null is not None else P, W, P, lse, ss if ss is not None else lse,
            n_buf, buf.stride(0) if buf is not None else 0, BT, D, H, D // H, K, eps, nb)
    flags = dict(HAS_NULL=null is not None, KP=triton.next_power_of_2(K), HP=HP, DHP=DHP,
                 DP=triton.next_power_of_2(D))
    key = ("prefix_fwd", D, H, K, nb, *flags.values(), *(str(a.dtype) for a in args[:6]))
    _launch(_prefix_fwd_kernel, key, grid, args, flags)
    LAUNCHES["prefix_fwd"] += 1
    return P, lse


# The score table. The queries are static parameters, so a source's per-head score for every later read is known
# as soon as the source exists: ``score_sources`` computes S[slot, k, t, h] = rms^-1 * <x_h, q_k g_k>_h for all
# announced reads k >= k_lo in ONE pass over the source (tensor-core dots; bf16 sources dot against a hi + lo bf16
# split of q g, so the scores keep fp32 accuracy). The forward (``_route_fwd_table_kernel``) then takes the max of
# its scores from the table first and mixes with one multiply-add per element and source (no online-softmax
# rescaling); the prefix kernel (``_prefix_fwd_table_kernel``) mixes K reads in one pass over their common prefix;
# the gradient kernel reads the score instead of a per-head dot product.


@triton.jit
def _sdot(x, w, wl, SPLIT: tl.constexpr, DOT: tl.constexpr, EMU: tl.constexpr):
    """(BLOCK_T, C) source part x (its own dtype) times (C, KP) weights -> (BLOCK_T, KP) fp32. SPLIT (x in bf16 /
    fp16): the weights as hi + lo parts w, wl in x's dtype (q g to ~2^-16 relative), two tensor-core dots with
    fp32 accumulation; else w fp32 (one fp32 dot). EMU (the CPU interpreter, whose 16-bit tl.dot is wrong in
    Triton 3.6 / 3.9): the same products as fp32 dots. Without DOT (parts narrower than 16): multiply-adds."""
    if SPLIT:
        if DOT and not EMU:
            return tl.dot(x, w) + tl.dot(x, wl)
        w = w.to(tl.float32) + wl.to(tl.float32)  # exact in fp32 (sum of a bf16 and its bf16 residual)
    xf = x.to(tl.float32)
    if DOT:
        return tl.dot(xf, w, input_precision="ieee")
    return tl.sum(xf[:, :, None] * w[None, :, :], axis=1)


@triton.jit
def _head_scores(x_ptr, w_ptr, wl_ptr, tok64, tmask, kk, kmask, h, D: tl.constexpr, DH: tl.constexpr,
                 DA: tl.constexpr, DB: tl.constexpr, SPLIT: tl.constexpr, DOT: tl.constexpr, EMU: tl.constexpr):
    """<x_h, w_k,h> (BLOCK_T, reads) fp32 of head h for tokens tok64 (mask tmask) and reads kk (mask kmask), the
    head's columns as ``_split``'s two parts (``_sdot`` each); not yet scaled by the RMS factor."""
    ca = h * DH + tl.arange(0, DA)
    x = tl.load(x_ptr + tok64[:, None] * D + ca[None, :], mask=tmask[:, None], other=0.0)
    woffs = kk[None, :] * D + ca[:, None]
    w = tl.load(w_ptr + woffs, mask=kmask[None, :], other=0.0)
    wl = w
    if SPLIT:
        wl = tl.load(wl_ptr + woffs, mask=kmask[None, :], other=0.0)
    acc = _sdot(x, w, wl, SPLIT, DOT, EMU)
    if DB > 0:
        cb = DA + tl.arange(0, DB)
        cbm = cb < DH
        cb = h * DH + cb
        x = tl.load(x_ptr + tok64[:, None] * D + cb[None, :], mask=tmask[:, None] & cbm[None, :], other=0.0)
        woffs = kk[None, :] * D + cb[:, None]
        w = tl.load(w_ptr + woffs, mask=kmask[None, :] & cbm[:, None], other=0.0)
        if SPLIT:
            wl = tl.load(wl_ptr + woffs, mask=kmask[None, :] & cbm[:, None], other=0.0)
        acc += _sdot(x, w, wl, SPLIT, DOT, EMU)
    return acc


@triton.jit
def _score_kernel(x_ptr, ss_ptr, w_ptr, wl_ptr, s_ptr, k_lo, K, BT, D: tl.constexpr, H: tl.constexpr,
                  DH: tl.constexpr, eps, BLOCK_T: tl.constexpr, KP: tl.constexpr, DA: tl.constexpr,
                  DB: tl.constexpr, SPLIT: tl.constexpr, DOT: tl.constexpr, EMU: tl.constexpr,
                  PDL: tl.constexpr = False):
    """S[k, t, h] (the slot's table, (K, BT, H) fp32) for reads k_lo <= k < K of one buffered source x (BT, D)
    (ss: its sums of squares (BT,)): one program per (token block, head) (program axis 1 = the head: many small
    independent programs, so the loads' latency overlaps); a head's columns as ``_split``'s two parts."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    tmask = tok < BT
    tok64 = tok.to(tl.int64)
    kk = k_lo + tl.arange(0, KP)
    kmask = kk < K
    r = 1.0 / tl.sqrt(tl.load(ss_ptr + tok, mask=tmask, other=1.0) / D + eps)
    acc = _head_scores(x_ptr, w_ptr, wl_ptr, tok64, tmask, kk, kmask, h, D, DH, DA, DB, SPLIT, DOT, EMU)
    tl.store(s_ptr + kk.to(tl.int64)[None, :] * BT * H + tok64[:, None] * H + h, acc * r[:, None],
             mask=tmask[:, None] & kmask[None, :])


SCORE_READS = 128  # reads per launch of the scoring kernel


def score_launch(KP: int, dot: bool = True) -> tuple[int, int]:
    """(tokens, warps) per program of the scoring kernel for a tile of KP reads: 64 tokens x 8 warps up to 64
    reads (every program loads the head's (KP, DH) weights from L2: fewer tokens per program multiply those
    loads), 32 x 4 for 65-128 (64 x 8 with 128 reads at head width 160 faulted on the H200 with Triton 3.6).
    Not autotuned (a faulting tile would be tried). Heads narrower than 16 columns (no tensor-core dot): 2 x 4."""
    if not dot:
        return 2, 4
    return (64, 8) if KP <= 64 else (32, 4)


def split_weights(W: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The score weights W = q * g (K, D) fp32 as ``score_sources`` takes them for sources of ``dtype``: (hi, lo)
    in bf16 / fp16 (hi + lo = W to ~2^-16 relative), or (W, None) for fp32 sources."""
    if dtype in (torch.bfloat16, torch.float16):
        hi = W.to(dtype)
        return hi, (W - hi.float()).to(dtype)
    return W, None


def score_sources(buf: torch.Tensor, ss: torch.Tensor, W: torch.Tensor, S: torch.Tensor, slot: int, k_lo: int,
                  H: int, eps: float, W_split: tuple | None = None) -> None:
    """Fill the score table S (cap, K, BT, H) fp32 for buffered source ``slot`` and reads k_lo..K-1 (W = q * g,
    (K, D) fp32 contiguous; ss the buffer's sums of squares (cap, BT)). W_split: ``split_weights(W, buf.dtype)``
    if the caller keeps it (one forward's reads all share it), else computed here."""
    _, BT, D = buf.shape
    K = W.shape[0]
    if S.numel() >= 2**31 or buf.numel() >= 2**31:
        raise ValueError("fused routing: score table / buffer need 64-bit offsets (limit 2**31); use a smaller "
                         "microbatch or routing_impl='compile'")
    wh, wl = W_split if W_split is not None else split_weights(W, buf.dtype)
    HP, DA, DB = _split(D, H)
    dot = DA >= 16 and (DB == 0 or DB >= 16)
    emu = os.environ.get("TRITON_INTERPRET") == "1"
    # At most SCORE_READS reads per launch (deeper models: one launch per chunk of reads; a (64, 256) tile of
    # scores does not compile); tokens and warps per program: ``score_launch``.
    for k0 in range(k_lo, K, SCORE_READS):
        k1 = min(K, k0 + SCORE_READS)
        KP = max(16, triton.next_power_of_2(k1 - k0))
        block_t, warps = score_launch(KP, dot)
        grid = (triton.cdiv(BT, block_t), H)
        _score_kernel[grid](buf[slot], ss[slot], wh, wl if wl is not None else wh, S[slot], k0, k1, BT, D, H,
                            D // H, eps, BLOCK_T=block_t, KP=KP, DA=DA, DB=DB, SPLIT=wl is not None, DOT=dot,
                            EMU=emu, num_warps=warps, **_pdl_kwargs(buf))
    LAUNCHES["score"] += 1


@triton.autotune(configs=_loop_configs(), key=["D", "H", "HAS_INIT", "NB"],
                 prune_configs_by={"early_config_prune": _prune_tiles})
@triton.jit
def _route_fwd_table_kernel(buf_ptr, s_ptr, out_ptr, lse_ptr, init_ptr, init_lse_ptr,
                 lo, n_buf, buf_stride, s_stride, BT,
                 NB, D: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, HAS_INIT: tl.constexpr,
                 BLOCK_T: tl.constexpr, HP: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, STAGES: tl.constexpr,
                 JC: tl.constexpr, PDL: tl.constexpr = False):
    """One read over buf[lo:n_buf) (after a prefix partial ``init`` / ``init_lse`` with HAS_INIT) with its scores
    from the table: s_ptr points at S[0, k] (slot j's at + j * s_stride, (BT, H) fp32). First the max score per
    (token, head) from the table, then one pass over the sources: p = exp(s - max), one multiply-add per
    element. Writes out (BT, D) and lse (BT, H) fp32."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    smask = tmask[:, None] & (hh[None, :] < H)
    _, _, offa, ma = _part(tok, hh, tmask, H, DH, D, 0, DA)
    offb, mb = offa, ma
    if DB > 0:
        _, _, offb, mb = _part(tok, hh, tmask, H, DH, D, DA, DB)
    hoffs = tok.to(tl.int64)[:, None] * H + hh[None, :]
    if HAS_INIT:
        lse0 = tl.load(init_lse_ptr + hoffs, mask=smask, other=0.0)
        m = lse0
    else:
        m = tl.full((BLOCK_T, HP), float("-inf"), tl.float32)
    jj = tl.arange(0, JC)
    for j0 in range(lo, n_buf, JC):  # the max: JC sources' scores per load (independent loads, no latency chain)
        jm = (j0 + jj) < n_buf
        sv = tl.load(s_ptr + (j0 + jj).to(tl.int64)[:, None, None] * s_stride + hoffs[None, :, :],
                     mask=jm[:, None, None] & smask[None, :, :], other=float("-inf"))
        m = tl.maximum(m, tl.max(sv, axis=0))
    m = tl.where(smask, m, 0.0)
    if HAS_INIT:
        l = tl.exp(lse0 - m)
        acca = _ld(init_ptr, offa, ma) * l[:, :, None]
        accb = acca
        if DB > 0:
            accb = _ld(init_ptr, offb, mb) * l[:, :, None]
    else:
        l = tl.zeros((BLOCK_T, HP), tl.float32)
        acca = tl.zeros((BLOCK_T, HP, DA), tl.float32)
        accb = acca
        if DB > 0:
            accb = tl.zeros((BLOCK_T, HP, DB), tl.float32)
    for j in tl.range(lo, n_buf, num_stages=STAGES):
        p = tl.exp(tl.load(s_ptr + j * s_stride + hoffs, mask=smask, other=0.0) - m)
        l += p
        acca = acca + p[:, :, None] * _ld(buf_ptr + j * buf_stride, offa, ma)
        if DB > 0:
            accb = accb + p[:, :, None] * _ld(buf_ptr + j * buf_stride, offb, mb)
    tl.store(out_ptr + offa, (acca / l[:, :, None]).to(out_ptr.dtype.element_ty), mask=ma)
    if DB > 0:
        tl.store(out_ptr + offb, (accb / l[:, :, None]).to(out_ptr.dtype.element_ty), mask=mb)
    tl.store(lse_ptr + hoffs, m + tl.log(l), mask=smask)


def route_fwd_table(buf: torch.Tensor, S: torch.Tensor, k: int, lo: int, n_buf: int, H: int, BT: int, D: int,
               out_dtype: torch.dtype, init: torch.Tensor | None = None, init_lse: torch.Tensor | None = None,
               lse_out: torch.Tensor | None = None):
    """Read k of the score table S (cap, K, BT, H) over buf[lo:n_buf) (after the partial init / init_lse, if
    given). Returns out (BT, D) in ``out_dtype`` and lse (BT, H) fp32 (written into ``lse_out`` if given)."""
    _check_index_range(buf)
    if n_buf - lo + (init is not None) <= 0:
        raise ValueError("routing needs at least one source")
    out = torch.empty(BT, D, device=buf.device, dtype=out_dtype)
    lse = lse_out if lse_out is not None else torch.empty(BT, H, device=buf.device, dtype=torch.float32)
    HP, DA, DB = _split(D, H)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    nb = _loop_bucket(n_buf - lo)
    args = (buf, S[0, k], out, lse, init if init is not None else out, init_lse if init_lse is not None else lse,
            lo, n_buf, buf.stride(0), S.stride(0), BT, nb, D, H, D // H)
    flags = dict(HAS_INIT=init is not None, HP=HP, DA=DA, DB=DB, JC=16)
    key = ("route_fwd_table", D, H, nb, *flags.values(), *(str(a.dtype) for a in args[:6]))
    _launch(_route_fwd_table_kernel, key, grid, args, flags)
    LAUNCHES["route_fwd_table"] += 1
    return out, lse


def _prefix_table_configs(full: bool = False) -> list:
    if not full and not autotune():
        return [triton.Config({"BLOCK_T": 1, "STAGES": 2}, num_warps=4)]
    return [triton.Config({"BLOCK_T": bt, "STAGES": ns}, num_warps=nw) for bt in (1, 2) for nw in (4, 8)
            for ns in (2, 3, 4)]


def _prune_prefix_table(configs, named_args, **kwargs):
    """Tiles (KP, BLOCK_T, HP, DA + DB): at most 16384 fp32 accumulators per program, 64 per warp at least."""
    row = _arg(named_args, kwargs, "KP") * _arg(named_args, kwargs, "HP") * (_arg(named_args, kwargs, "DA") +
                                                                            _arg(named_args, kwargs, "DB"))
    return _keep_tiles(configs, row, 16384)


@triton.autotune(configs=_prefix_table_configs(), key=["D", "H", "KP", "NB"],
                 prune_configs_by={"early_config_prune": _prune_prefix_table})
@triton.jit
def _prefix_fwd_table_kernel(buf_ptr, s_ptr, p_ptr, lse_ptr, n_buf, buf_stride, s_stride, BT, K, NB, D: tl.constexpr,
                    H: tl.constexpr, DH: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HP: tl.constexpr,
                    DA: tl.constexpr, DB: tl.constexpr, STAGES: tl.constexpr, JC: tl.constexpr,
                    PDL: tl.constexpr = False):
    """Partials of K consecutive reads over buf[0:n_buf) in one pass: s_ptr points at S[0, k0] (read k0 + i's
    scores of slot j at + j * s_stride + i * BT * H). The reads are a leading tile dimension: each element of
    a source is loaded once and mixed into K accumulators (K multiply-adds). Writes P (K, BT, D) (each read's
    normalised partial mix) and lse (K, BT, H) fp32."""
    _pdl_enter(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.arange(0, HP)
    tmask = tok < BT
    smask = tmask[:, None] & (hh[None, :] < H)
    kk = tl.arange(0, KP)
    kmask = kk < K
    _, _, offa, ma = _part(tok, hh, tmask, H, DH, D, 0, DA)
    offb, mb = offa, ma
    if DB > 0:
        _, _, offb, mb = _part(tok, hh, tmask, H, DH, D, DA, DB)
    koffs = kk.to(tl.int64)[:, None, None] * (BT * H) + (tok.to(tl.int64)[:, None] * H + hh[None, :])[None, :, :]
    kmask3 = kmask[:, None, None] & smask[None, :, :]
    m = tl.full((KP, BLOCK_T, HP), float("-inf"), tl.float32)
    jj = tl.arange(0, JC)
    for j0 in range(0, n_buf, JC):  # the max: JC sources' scores per load
        jm = (j0 + jj) < n_buf
        sv = tl.load(s_ptr + (j0 + jj).to(tl.int64)[:, None, None, None] * s_stride + koffs[None, :, :, :],
                     mask=jm[:, None, None, None] & kmask3[None, :, :, :], other=float("-inf"))
        m = tl.maximum(m, tl.max(sv, axis=0))
    m = tl.where(kmask3, m, 0.0)
    l = tl.zeros((KP, BLOCK_T, HP), tl.float32)
    acca = tl.zeros((KP, BLOCK_T, HP, DA), tl.float32)
    accb = acca
    if DB > 0:
        accb = tl.zeros((KP, BLOCK_T, HP, DB), tl.float32)
    for j in tl.range(0, n_buf, num_stages=STAGES):
        p = tl.exp(tl.load(s_ptr + j * s_stride + koffs, mask=kmask3, other=0.0) - m)
        l += p
        acca = acca + p[:, :, :, None] * _ld(buf_ptr + j * buf_stride, offa, ma)[None, :, :, :]
        if DB > 0:
            accb = accb + p[:, :, :, None] * _ld(buf_ptr + j * buf_stride, offb, mb)[None, :, :, :]
    pk = kk.to(tl.int64)[:, None, None, None] * (BT * D)
    k4 = kmask[:, None, None, None]
    tl.store(p_ptr + pk + offa[None], (acca / l[:, :, :, None]).to(p_ptr.dtype.element_ty), mask=k4 & ma[None])
    if DB > 0:
        tl.store(p_ptr + pk + offb[None], (accb / l[:, :, :, None]).to(p_ptr.dtype.element_ty), mask=k4 & mb[None])
    tl.store(lse_ptr + koffs, m + tl.log(l), mask=kmask3)


def prefix_fwd_table(buf: torch.Tensor, S: torch.Tensor, k0: int, K: int, n_buf: int, H: int, BT: int, D: int,
                out_dtype: torch.dtype):
    """Partials of reads k0..k0+K-1 of the score table S over buf[0:n_buf): P (K, BT, D) in ``out_dtype``,
    lse (K, BT, H) fp32."""
    if n_buf < 1:
        raise ValueError("prefix_fwd_table needs at least one buffered source")
    P, lse = _prefix_outputs(buf, n_buf, None, K, BT, D, H, buf.device, out_dtype)
    HP, DA, DB = _split(D, H)
    grid = lambda meta: (triton.cdiv(BT, meta["BLOCK_T"]),)  # noqa: E731
    nb = _loop_bucket(n_buf)
    args = (buf, S[0, k0], P, lse, n_buf, buf.stride(0), S.stride(0), BT, K, nb, D, H, D // H)
    flags = dict(KP=triton.next_power_of_2(K), HP=HP, DA=DA, DB=DB, JC=8)
    key = ("prefix_fwd_table", D, H, nb, *flags.values(), str(buf.dtype), str(out_dtype))
    _launch(_prefix_fwd_table_kernel, key, grid, args, flags)
    LAUNCHES["prefix_fwd_table"] += 1
    return P, lse


# the kernels that begin with ``_pdl_enter`` (``_launch`` gives them ``_pdl_kwargs``)
_PDL_KERNELS = (_append_kernel, _route_fwd_table_kernel, _prefix_fwd_table_kernel, _stash_kernel, _src_bwd_kernel,
                _src_group_bwd_kernel)
