"""Qwen3-style decoder with a pluggable residual scheme.

RMSNorm (eps 1e-6), SwiGLU MLP, GQA attention with per-head q/k RMSNorm, RoPE
(theta 1e4), no biases, N(0, 0.02^2) init, tied embeddings, no dropout.
With ``qk_norm=False, tie_embeddings=False`` it is the Llama architecture
(used by the continued-pretraining arm).

The decoder loop never branches on the residual variant: see
``mhar.model.residuals.base.Residual``.

Incremental decoding (``KVCache``; ``mhar.model.inference.generate``): attention keeps the
keys/values of the positions already processed in a static, pre-allocated cache
(per layer (B, n_kv, capacity, hd), written in place at each row's next position);
every residual variant mixes only across depth, per token, so a step builds the
residual state (and, for the routed variants, the depth sources) of the new
positions only: a token's routed reads cost O(N d), nothing of the prompt's sources
is kept or re-read. A cached step computes what the full forward computes at those
positions. ``mhar.model.inference`` (which imports this module, never the reverse: an export ships the model
without the runner) runs the decode steps compiled and CUDA-graph captured.

The loss is :func:`lm_loss`, the one next-token cross-entropy of training, evaluation and the Hugging Face
wrapper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mhar.model.config import ModelConfig, model_config_from_dict
from mhar.model.kv_cache import AttnStep, KVCache
from mhar.model.residuals import build_residual


def lm_loss(logits: Tensor, labels: Tensor, z_weight: float = 0.0) -> tuple[Tensor, Tensor]:
    """(mean next-token cross-entropy, CE + z_weight * z-loss), fp32 scalars, of ``logits`` (..., V) against
    ``labels`` (...) already aligned with them (-100 = ignore). The z-loss is mean(logsumexp(logits)^2) over the
    target positions (PaLM)."""
    flat = logits.float().flatten(0, -2)  # (N, V)
    target = labels.flatten()
    loss = F.cross_entropy(flat, target, ignore_index=-100)
    if not z_weight:
        return loss, loss
    mask = target != -100
    z = (torch.logsumexp(flat, dim=-1).pow(2) * mask).sum() / mask.sum().clamp(min=1)
    return loss, loss + z_weight * z


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_frequencies(cfg: ModelConfig) -> Tensor:
    """Inverse frequencies (head_dim/2,), with optional Llama-3 frequency scaling.

    Computed in fp32 with the same operations as Hugging Face transformers
    (``compute_default_rope_parameters`` / ``_compute_llama3_parameters``), so a
    converted Llama checkpoint reproduces its logits bit for bit (``mhar.cpt``).
    """
    hd = cfg.resolved_head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))  # fp32
    sc = cfg.rope_scaling
    if sc:
        factor = float(sc["factor"])
        lo, hi = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
        old = float(sc.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        lo_wl, hi_wl = old / lo, old / hi
        scaled = torch.where(wavelen > lo_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= lo_wl) & (wavelen >= hi_wl)
        inv = torch.where(is_mid, mid, scaled)
    return inv


class Rotary(nn.Module):
    """Precomputed cos/sin tables (rotate-half convention, as in Qwen3/Llama)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("inv_freq", rope_frequencies(cfg), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # model.to(bf16) casts buffers too: keep the frequencies in fp32 on the new device (computed once here,
        # not on the host at every forward, which cost a blocking host-to-device copy per call)
        super()._apply(fn, *args, **kwargs)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = rope_frequencies(self.cfg).to(self.inv_freq.device)
        return self

    def forward(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos/sin (T, hd) for positions 0..T-1."""
        return self.at(torch.arange(T, device=device))

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin for explicit positions: (T,) -> (T, hd); (B, T) -> (B, 1, T, hd) (per-row positions)."""
        inv = self.inv_freq
        if inv.dtype != torch.float32:  # model.to(bf16) also casts buffers: recompute at full precision
            inv = rope_frequencies(self.cfg)
        freqs = positions.to(torch.float32)[..., None] * inv.to(positions.device)  # (..., T, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., T, hd)
        if positions.dim() == 2:
            emb = emb[:, None]  # (B, 1, T, hd): broadcast over heads
        return emb.cos(), emb.sin()


def cached_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> Tensor:
    """Attention of new queries over a static cache: q (B, h, T, hd); k/v (B, n_kv, S, hd) (all slots);
    slot s is visible to the query at position p when s <= p (a row's slots past its length are masked).

    Written as fp32 products and sums (no matmul): scores and the weighted sum accumulate in fp32 from the
    16-bit cache, no GQA copy of the cache (the query heads of a KV head are a second axis), and under
    ``torch.compile`` each becomes one reduction kernel that reads the cache once (decode: T = 1)."""
    B, h, T, hd = q.shape
    kv, S = k.shape[1], k.shape[2]
    rep = h // kv
    qg = q.float().reshape(B, kv, rep * T, 1, hd) * (1.0 / math.sqrt(hd))  # head g*rep + r -> (g, r*T + t)
    scores = (qg * k.float()[:, :, None]).sum(-1)  # (B, kv, rep*T, S)
    visible = torch.arange(S, device=q.device)[None, None, :] <= positions[:, :, None]  # (B, T, S)
    visible = visible[:, None, None].expand(B, 1, rep, T, S).reshape(B, 1, rep * T, S)
    p = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    y = (p[..., None] * v.float()[:, :, None]).sum(-2)  # (B, kv, rep*T, hd)
    return y.reshape(B, h, T, hd).to(q.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: (B, h, T, hd); cos/sin: (T, hd)
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Attention(nn.Module):
    """GQA causal self-attention with optional per-head q/k RMSNorm.

    Accepts x of shape (B, T, D), or (B, T, G, D) with G = n_kv_heads, in which
    case KV group g (its K/V head and its query heads) reads x[:, :, g] (MHAR-HW).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        d = cfg.d_model
        self.q_proj = nn.Linear(d, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, d, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.hd, cfg.norm_eps) if cfg.qk_norm else nn.Identity()

    def _grouped_proj(self, x: Tensor, lin: nn.Linear) -> Tensor:
        # x: (B, T, G, D); weight rows are grouped by KV head: (G, out/G, D)
        G = x.shape[2]
        w = lin.weight.view(G, -1, x.shape[-1])
        return torch.einsum("btgd,god->btgo", x, w).flatten(2)  # (B, T, out)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, step: Optional[AttnStep] = None) -> Tensor:
        """``step``: this layer's KV cache of an incremental call; None = full causal forward."""
        if x.dim() == 4:
            B, T = x.shape[:2]
            q, k, v = (self._grouped_proj(x, p) for p in (self.q_proj, self.k_proj, self.v_proj))
        else:
            B, T, _ = x.shape
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q.view(B, T, self.n_heads, self.hd)).transpose(1, 2)  # (B, h, T, hd)
        k = self.k_norm(k.view(B, T, self.n_kv, self.hd)).transpose(1, 2)  # (B, kv, T, hd)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, kv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if step is not None:
            step.write(k, v)
        if step is not None and step.positions is not None:  # a cached step: attend over the static cache
            y = cached_attention(q, step.k, step.v, step.positions)  # (B, h, T, hd)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One transformer layer = two sublayers, each f(RMSNorm(h))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def attn_sublayer(self, h: Tensor, cos: Tensor, sin: Tensor, step: Optional[AttnStep] = None) -> Tensor:
        return self.attn(self.attn_norm(h), cos, sin, step)

    def mlp_sublayer(self, h: Tensor) -> Tensor:
        return self.mlp(self.mlp_norm(h))


@dataclass
class ModelOutput:
    logits: Optional[Tensor]  # (B, T, V); None on the training path (``z_weight`` given)
    loss: Optional[Tensor] = None
    routing: Optional[dict[str, Tensor]] = None  # site -> (B, T, H, N) routing weights
    objective: Optional[Tensor] = None  # training path: loss + z_weight * z-loss (what to differentiate)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(cfg)
        self.residual = build_residual(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        self.residual.reset_parameters()

    def sublayer(self, i: int, h: Tensor, cos: Tensor, sin: Tensor, step: Optional[AttnStep] = None) -> Tensor:
        """Sublayer i on its read h; ``step``: layer i // 2's share of a cached call."""
        block = self.layers[i // 2]
        if i % 2:
            return block.mlp_sublayer(h)
        return block.attn_sublayer(h, cos, sin) if step is None else block.attn_sublayer(h, cos, sin, step)

    def hidden(self, input_ids: Tensor, cache: Optional[KVCache] = None,
               lengths: Optional[Tensor] = None) -> Tensor:
        """Final-normed hidden states (B, T, D).

        With ``cache``: an incremental call. The first call (empty cache) is the prefill:
        ``input_ids`` right-padded, ``lengths`` (B,) the true lengths (default: all T).
        Later calls feed the next tokens of every row (B, T_new) at positions
        ``lengths + tokens fed since``; only the new positions are computed.
        """
        B, T = input_ids.shape
        dev = input_ids.device
        positions = None  # (B, T) positions of the new tokens of a cached step (None: no cache or the prefill)
        if cache is None:
            cos, sin = self.rotary(T, dev)
        elif cache.empty:  # the prefill: causal (padding only follows the positions that are read)
            if not cache.managed:
                cfg = self.cfg
                cap = max(T, cache.capacity or cfg.max_seq_len)
                kv_dtype = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) \
                    else self.embed.weight.dtype
                cache.allocate(B, cfg.n_kv_heads, cfg.resolved_head_dim, cap, dev, kv_dtype)
                cache.filled = T
            cos, sin = self.rotary(T, dev)
            cache.pos.copy_(torch.full((B,), T, device=dev) if lengths is None else lengths.to(dev))
            cache.empty = False
        else:
            if not cache.managed and not torch.compiler.is_compiling():
                cache.reserve(T)
            positions = cache.pos[:, None] + torch.arange(T, device=dev)  # (B, T)
            cos, sin = self.rotary.at(positions)
            cache.pos.add_(T)
        res = self.residual
        state = res.init(self.embed(input_ids))  # (B, T, D)
        for i in range(self.cfg.n_sublayers):
            lstep = None if cache is None or i % 2 else cache.layer(i // 2, positions)
            state = res.write(state, i, self.sublayer(i, res.read(state, i), cos, sin, lstep))
        return self.final_norm(res.readout(state))

    def head_loss(self, h: Tensor, labels: Tensor, z_weight: float = 0.0) -> tuple[Tensor, Tensor]:
        """(mean next-token cross-entropy, CE + z_weight * z-loss), fp32 scalars, from the final-normed
        hidden states ``h`` (B, T, D). The z-loss is mean(logsumexp(logits)^2) over target positions (PaLM).
        The training step (``mhar.training.step``) compiles this method on its own, so the fp32 logits stay fused."""
        return lm_loss(self.lm_head(h), labels, z_weight)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, *,
                collect_routing: bool = False, z_weight: Optional[float] = None) -> ModelOutput:
        """input_ids (B, T); labels (B, T) are next-token targets (-100 = ignore).

        ``z_weight`` (a float, with labels) selects the training path: no logits are returned, the loss
        comes from :meth:`head_loss` and ``objective`` = loss + z_weight * z-loss."""
        self.residual.routing_log = {} if collect_routing else None
        try:
            h = self.hidden(input_ids)
            if z_weight is not None:
                if labels is None:
                    raise ValueError("z_weight (the training path) needs labels")
                loss, objective = self.head_loss(h, labels, z_weight)
                return ModelOutput(logits=None, loss=loss, objective=objective,
                                   routing=self.residual.routing_log)
            logits = self.lm_head(h)  # (B, T, V)
        finally:
            routing, self.residual.routing_log = self.residual.routing_log, None
        loss = lm_loss(logits, labels)[0] if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, routing=routing)

    def num_params(self, exclude_embedding: bool = False) -> int:
        seen, n = set(), 0
        for p in self.parameters():  # parameters() already de-duplicates tied weights
            if id(p) in seen:
                continue
            seen.add(id(p))
            n += p.numel()
        if exclude_embedding:
            n -= self.embed.weight.numel()
        return n


def build_model(cfg: ModelConfig | dict) -> Transformer:
    if isinstance(cfg, dict):
        cfg = model_config_from_dict(cfg)
    return Transformer(cfg)
