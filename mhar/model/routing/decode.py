"""Depth routing of a few positions (decode steps): one Triton kernel per read.

``decode_read(buf, ms, n, q, g, H, eps, pending=None, extra=None) -> out (B, T, D)`` routes over the first ``n``
sources of a (capacity, B, T, D) buffer whose per-source mean squares over D (fp32) are ``ms`` (capacity, B, T),
as ``mhar.model.routing.reference.route_reference`` does (RMSNorm keys, one softmax per head, fp32 mix). ``pending``:
the newest source, not yet written: the kernel writes it (and its mean square) into slot ``n`` and includes
it, so a decode step's append costs no launch of its own; ``extra``: one transient source read last (Block
AttnRes' partial sum). One program per (position, head) streams that head's slice of the position's sources
in chunks with an online softmax: a read is one launch (the torch expression ``reference.route_slots_reference``
takes four
or five small kernels, which dominate a decode step replayed as a CUDA graph). The training kernels
(``mhar.model.routing.fused``) are built for thousands of positions per read; decoding has a few.

Registered as the custom op ``mhar::decode_read`` (mutates ``buf`` / ``ms`` when ``pending`` is given) with a
fake implementation, so ``torch.compile`` traces a decode step through it without a graph break.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

import torch
from torch import Tensor

__all__ = ["decode_read", "available"]

try:  # Triton is optional (mhar[kernels]); without it the caller keeps the PyTorch expression
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None


def available(device: torch.device) -> bool:
    """Whether the kernel runs on ``device``: CUDA with Triton, or any device under the Triton interpreter."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _decode_read_kernel(buf, ms, pend, ext, q, g, out, n, R, eps,
                            D: tl.constexpr, DH: tl.constexpr, DHP: tl.constexpr, DP: tl.constexpr,
                            SB: tl.constexpr, HAS_PEND: tl.constexpr, HAS_EXT: tl.constexpr):
        r = tl.program_id(0)  # position (row of B*T)
        h = tl.program_id(1)  # head
        offs = tl.arange(0, DHP)
        dm = offs < DH
        col = h * DH + offs
        gq = tl.load(g + col, mask=dm, other=0.0).to(tl.float32) * tl.load(q + col, mask=dm, other=0.0).to(tl.float32)
        m = tl.full([1], float("-inf"), tl.float32)
        l = tl.zeros([1], tl.float32)
        acc = tl.zeros([DHP], tl.float32)
        sl = tl.arange(0, SB)
        for s0 in range(0, n, SB):
            slot = s0 + sl
            sm = slot < n
            x = tl.load(buf + (slot[:, None] * R + r) * D + col[None, :], mask=sm[:, None] & dm[None, :],
                        other=0.0).to(tl.float32)  # (SB, DHP)
            msv = tl.load(ms + slot * R + r, mask=sm, other=1.0)
            sc = tl.sum(x * gq[None, :], 1) * tl.math.rsqrt(msv + eps)
            sc = tl.where(sm, sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new)
            l = l * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * x, 0)
            m = m_new
        full = tl.arange(0, DP)
        fm = full < D
        if HAS_PEND:  # the newest source: written to slot n (with its mean square), then mixed
            xf = tl.load(pend + r * D + full, mask=fm, other=0.0).to(tl.float32)
            msp = tl.sum(xf * xf, 0) / D
            xh = tl.load(pend + r * D + col, mask=dm, other=0.0).to(buf.dtype.element_ty)
            tl.store(buf + (n * R + r) * D + col, xh, mask=dm)
            if h == 0:
                tl.store(ms + n * R + r, msp)
            xh = xh.to(tl.float32)
            sc = tl.sum(xh * gq, 0) * tl.math.rsqrt(msp + eps)
            m_new = tl.maximum(m, sc)
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new)
            l = l * alpha + p
            acc = acc * alpha + p * xh
            m = m_new
        if HAS_EXT:  # a transient source, read last
            xf = tl.load(ext + r * D + full, mask=fm, other=0.0).to(tl.float32)
            mse = tl.sum(xf * xf, 0) / D
            xe = tl.load(ext + r * D + col, mask=dm, other=0.0).to(tl.float32)
            sc = tl.sum(xe * gq, 0) * tl.math.rsqrt(mse + eps)
            m_new = tl.maximum(m, sc)
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new)
            l = l * alpha + p
            acc = acc * alpha + p * xe
            m = m_new
        tl.store(out + r * D + col, (acc / l).to(out.dtype.element_ty), mask=dm)


def _launch(buf: Tensor, ms: Tensor, n: int, q: Tensor, g: Tensor, H: int, eps: float,
            pending: Optional[Tensor], extra: Optional[Tensor], out: Tensor) -> None:
    cap, B, T, D = buf.shape
    R = B * T
    DH = D // H
    pend = pending.expand(B, T, D).contiguous() if pending is not None else buf
    ext = extra.expand(B, T, D).contiguous() if extra is not None else buf
    _decode_read_kernel[(R, H)](buf, ms, pend, ext, q.contiguous(), g.contiguous(), out, n, R, eps,
                                D=D, DH=DH, DHP=triton.next_power_of_2(DH), DP=triton.next_power_of_2(D),
                                SB=min(32, triton.next_power_of_2(max(cap, 1))), HAS_PEND=pending is not None,
                                HAS_EXT=extra is not None, num_warps=4)


def _op_name() -> str:
    """``mhar::decode_read`` for the package's module. A copy of this file shipped inside a Hugging Face export
    runs under another module name, possibly in a process that also imported the package: it registers an op
    of its own name, since defining one op twice breaks the dispatcher (and a copy's op goes with its module)."""
    if __name__ == "mhar.model.routing.decode":
        return "mhar::decode_read"
    return "mhar_export::decode_read_" + hashlib.sha1(__name__.encode()).hexdigest()[:12]


def _impl(buf: Tensor, ms: Tensor, n: int, q: Tensor, g: Tensor, H: int, eps: float,
          pending: Optional[Tensor], extra: Optional[Tensor]) -> Tensor:
    out = torch.empty(buf.shape[1:], dtype=buf.dtype, device=buf.device)
    _launch(buf, ms, n, q, g, H, eps, pending, extra, out)
    return out


def _fake(buf, ms, n, q, g, H, eps, pending, extra):
    return buf.new_empty(buf.shape[1:])


_NAMESPACE, _OP = _op_name().split("::")
if hasattr(getattr(torch.ops, _NAMESPACE), _OP):  # this module executed again (an export loaded twice)
    _decode_read_op = getattr(getattr(torch.ops, _NAMESPACE), _OP)
else:
    _decode_read_op = torch.library.custom_op(_op_name(), _impl, mutates_args=("buf", "ms"))
    _decode_read_op.register_fake(_fake)


def decode_read(buf: Tensor, ms: Tensor, n: int, q: Tensor, g: Tensor, H: int, eps: float,
                pending: Optional[Tensor] = None, extra: Optional[Tensor] = None) -> Tensor:
    """The routed read (B, T, D) over slots [0, n) of ``buf`` (cap, B, T, D) (+ ``pending``, written to slot n,
    + ``extra``); ``ms`` (cap, B, T) fp32 mean squares (slot n written with ``pending``). Inference only (no
    autograd)."""
    if buf.shape[-1] % H:
        raise ValueError(f"num_heads={H} must divide the width {buf.shape[-1]}")
    if pending is not None and n >= buf.shape[0]:
        raise ValueError(f"decode_read: slot {n} is past the capacity {buf.shape[0]}")
    return _decode_read_op(buf, ms, int(n), q, g, int(H), float(eps), pending, extra)
