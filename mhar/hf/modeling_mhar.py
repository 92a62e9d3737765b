"""Hugging Face ``transformers`` model for checkpoints exported by the MHAR harness.

This file is shipped inside every exported model directory whose residual variant is not the
plain pre-norm baseline (those load as stock ``Qwen3ForCausalLM`` / ``LlamaForCausalLM``)::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)  # (it reads config.json, which names this file)
    out = model.generate(**tok("The cat", return_tensors="pt"), max_new_tokens=20, do_sample=False)

It is self-contained: PyTorch and ``transformers`` only, so it runs where the ``mhar`` package is
not installed. Where ``mhar`` is importable and the inputs are on a GPU (``routing_impl: auto``), the
depth routing runs through ``mhar.model.routing``'s fused Triton kernels instead of the PyTorch code here
(same math); ``routing_impl: torch`` forces the PyTorch code, any other name picks that ``mhar``
router (e.g. ``fused``).

The decoder is Qwen3's (RMSNorm, SwiGLU, GQA with optional per-head q/k RMSNorm, RoPE, no biases)
and the residual connection is one of the harness's variants (``config.residual.variant``):

* ``mhar`` / ``attnres``: every sublayer (and one final read before the last norm) reads a softmax
  mix of the embedding and all earlier sublayer outputs, one softmax per head of ``d / H`` features
  (``attnres``: H = 1); keys are RMSNorm(source) over the full width with a learned weight, no scale;
* ``block_attnres``: the same over block sums (embedding, completed blocks, current partial sum);
* ``mhar_hw``: attention sublayers read one mix per KV group, each feeding only its group's Q/K/V;
* ``mhar_delta``: the pre-norm stream plus ``alpha_i * route(null source, block deltas)``;
* ``hyper``: n-stream hyper-connections (static or dynamic).

Generation uses ``transformers``' ``Cache`` (a ``DynamicCache`` by default): attention keeps the
keys/values of earlier positions; the residual mixes only across depth, per token, so a cached step
builds the residual state of the new positions only and computes what the full forward computes there.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

try:  # transformers >= 4.36
    from transformers.cache_utils import Cache, DynamicCache
except ImportError:  # pragma: no cover - very old transformers
    Cache = DynamicCache = None

VARIANTS = ("attnres", "mhar", "block_attnres", "mhar_hw", "mhar_delta", "hyper", "baseline")
_TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
# transformers 5 renamed the cache argument / output field from ``past_key_values`` to ``cache``
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_BASE_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------
_RESIDUAL_DEFAULTS = {"variant": "mhar", "heads": 1, "hyper_n": 4, "hyper_dynamic": True, "blocks": 8,
                      "delta_block_layers": 4, "routing_eps": 1e-6}


class MharConfig(PretrainedConfig):
    """Architecture of an MHAR-harness decoder (field names follow Qwen3's where they exist).

    ``residual``: the harness's residual config (``variant``, ``heads``, ``hyper_n``, ``hyper_dynamic``,
    ``blocks``, ``delta_block_layers``, ``routing_eps``). ``rope_llama3``: Llama-3 frequency scaling
    (``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) or None.
    ``routing_impl``: ``auto`` (the ``mhar`` fused kernels on a GPU when ``mhar`` is installed, else the
    PyTorch code in this file), ``torch``, or a ``mhar.model.routing`` implementation name.
    ``mhar_routing_impl``: the implementation the model was trained with (provenance; an import back into
    the harness restores it).
    """

    model_type = "mhar"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, vocab_size: int = 257, hidden_size: int = 64, intermediate_size: int = 192,
                 num_hidden_layers: int = 2, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                 head_dim: Optional[int] = None, max_position_embeddings: int = 2048, rope_theta: float = 10000.0,
                 rope_llama3: Optional[dict] = None, rms_norm_eps: float = 1e-6, initializer_range: float = 0.02,
                 qk_norm: bool = True, hidden_act: str = "silu", residual: Optional[dict] = None,
                 routing_impl: str = "auto", mhar_routing_impl: str = "eager", use_cache: bool = True,
                 tie_word_embeddings: bool = True, **kwargs: Any):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.rope_llama3 = dict(rope_llama3) if rope_llama3 else None
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.qk_norm = qk_norm
        self.hidden_act = hidden_act
        self.residual = {**_RESIDUAL_DEFAULTS, **(residual or {})}
        self.routing_impl = routing_impl
        self.mhar_routing_impl = mhar_routing_impl
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self._validate()

    def _validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"MharConfig: {msg}")

        r = self.residual
        need(r["variant"] in VARIANTS, f"residual.variant {r['variant']!r} is not one of {', '.join(VARIANTS)}")
        need(self.hidden_act == "silu", f"hidden_act must be 'silu' (SwiGLU), got {self.hidden_act!r}")
        need(self.num_attention_heads % self.num_key_value_heads == 0,
             "num_attention_heads must be a multiple of num_key_value_heads")
        need(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        need(self.hidden_size % int(r["heads"]) == 0,
             f"residual.heads={r['heads']} must divide hidden_size={self.hidden_size}")
        if r["variant"] == "block_attnres":
            need(1 <= int(r["blocks"]) <= 2 * self.num_hidden_layers,
                 f"residual.blocks must be between 1 and 2 * num_hidden_layers, got {r['blocks']}")
        if r["variant"] == "mhar_delta":
            need(self.num_hidden_layers % int(r["delta_block_layers"]) == 0,
                 "residual.delta_block_layers must divide num_hidden_layers")


# --------------------------------------------------------------------------------------------------
# Decoder pieces (Qwen3 / Llama)
# --------------------------------------------------------------------------------------------------
class MharRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rope_inv_freq(config: MharConfig) -> Tensor:
    """Inverse RoPE frequencies (head_dim / 2,) in fp32, with the optional Llama-3 scaling."""
    hd = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    sc = config.rope_llama3
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


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, h, T, hd); cos/sin (B, 1, T, hd): rotate-half RoPE computed in fp32."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class MharAttention(nn.Module):
    """GQA causal self-attention with optional per-head q/k RMSNorm.

    ``x`` is (B, T, D), or (B, T, G, D) with G = num_key_value_heads: KV group g (its K/V head and its
    query heads) then reads x[:, :, g] (the ``mhar_hw`` variant)."""

    def __init__(self, config: MharConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, d, bias=False)
        self.q_norm = MharRMSNorm(self.hd, config.rms_norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = MharRMSNorm(self.hd, config.rms_norm_eps) if config.qk_norm else nn.Identity()

    @staticmethod
    def _grouped(x: Tensor, lin: nn.Linear) -> Tensor:
        g = x.shape[2]
        w = lin.weight.view(g, -1, x.shape[-1])  # rows grouped by KV head
        return torch.einsum("btgd,god->btgo", x, w).flatten(2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor], cache) -> Tensor:
        if x.dim() == 4:
            B, T = x.shape[:2]
            q, k, v = (self._grouped(x, p) for p in (self.q_proj, self.k_proj, self.v_proj))
        else:
            B, T, _ = x.shape
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q.view(B, T, self.n_heads, self.hd)).transpose(1, 2)  # (B, h, T, hd)
        k = self.k_norm(k.view(B, T, self.n_kv, self.hd)).transpose(1, 2)  # (B, kv, T, hd)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, kv, T_all, hd)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MharMLP(nn.Module):
    def __init__(self, config: MharConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MharDecoderLayer(nn.Module):
    """One layer = an attention and an MLP sublayer, each f(RMSNorm(h)); the residual is the model's."""

    def __init__(self, config: MharConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = MharRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MharAttention(config, layer_idx)
        self.post_attention_layernorm = MharRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MharMLP(config)


# --------------------------------------------------------------------------------------------------
# Depth routing
# --------------------------------------------------------------------------------------------------
def route(sources: Tensor, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float) -> Tensor:
    """Depth routing over stacked sources (N, B, T, D): per head h, softmax_i(<q_h, RMSNorm(s_i)[h]>)
    mixes slice h of the sources; keys are normed over the full width; fp32 inside."""
    N, B, T, D = sources.shape
    H = num_heads
    s32 = sources.float()
    keys = s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    scores = (keys.view(N, B, T, H, D // H) * query.float().view(H, D // H)).sum(-1)  # (N, B, T, H)
    weights = torch.softmax(scores, dim=0)
    out = (weights.unsqueeze(-1) * s32.view(N, B, T, H, D // H)).sum(0)
    return out.reshape(B, T, D).to(sources.dtype)


class TorchRouter:
    """Sources in a Python list, stacked per read (the PyTorch path)."""

    def init(self, first: Tensor, capacity: int):
        return [first]

    def append(self, state, src: Tensor):
        return state + [src]

    def read(self, state, query, norm_weight, num_heads, eps=1e-6, *, extra=None, lookahead=None):
        srcs = state if extra is None else state + [extra]
        shape = torch.broadcast_shapes(*(s.shape for s in srcs))  # a learnable null source broadcasts
        srcs = [s if s.shape == shape else s.expand(shape) for s in srcs]
        return route(torch.stack(srcs, 0), query, norm_weight, num_heads, eps)


def make_router(impl: str, trained: str, device: torch.device):
    """The router of one forward: ``mhar``'s fused kernels where they apply, else :class:`TorchRouter`."""
    if impl == "torch" or (impl == "auto" and device.type != "cuda"):
        return TorchRouter()
    # auto on a GPU: mhar's fused kernels (one fused implementation; an older export's withdrawn fused
    # variant name, e.g. fused_v7_sg8, in ``trained`` names the same kernels' predecessor)
    name = "fused" if impl == "auto" else impl
    try:
        from mhar.model.routing import get_router  # optional: the harness's kernels
    except ImportError as e:
        if impl == "auto":
            return TorchRouter()
        raise ImportError(f"routing_impl={impl!r} needs the mhar package (pip install mhar); "
                          "set routing_impl='torch' (or 'auto') to use this file's PyTorch routing") from e
    try:
        return get_router(name)
    except (RuntimeError, ValueError, ImportError):
        if impl == "auto":  # e.g. Triton missing: the PyTorch path computes the same
            return TorchRouter()
        raise


class _Residual(nn.Module):
    """init / read / write / readout over the 2L sublayers (attn0, mlp0, attn1, ...)."""

    def __init__(self, config: MharConfig):
        super().__init__()
        self.config = config
        self.n_sublayers = 2 * config.num_hidden_layers
        self.eps = float(config.residual["routing_eps"])
        self.router = TorchRouter()

    def begin(self, device: torch.device) -> None:
        self.router = make_router(self.config.routing_impl, self.config.mhar_routing_impl, device)

    def reset_parameters(self) -> None:
        pass


class _Baseline(_Residual):
    def init(self, emb):
        return emb

    def read(self, state, i):
        return state

    def write(self, state, i, out):
        return state + out

    def readout(self, state):
        return state


class _Routed(_Residual):
    """mhar (H heads) / attnres (H = 1): sources = embedding + every sublayer output."""

    def __init__(self, config: MharConfig):
        super().__init__(config)
        self.heads = 1 if config.residual["variant"] == "attnres" else int(config.residual["heads"])
        S, D = self.n_sublayers + 1, config.hidden_size
        self.queries = nn.Parameter(torch.zeros(S, D))
        self.key_norms = nn.Parameter(torch.ones(S, D))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb):
        return self.router.init(emb, capacity=self.n_sublayers + 1)

    def _route(self, state, site, extra=None):
        q, g = self.queries[site], self.key_norms[site]
        nxt = (self.queries[site + 1:], self.key_norms[site + 1:]) if site < self.n_sublayers else None
        kw = {} if extra is None else {"extra": extra}
        return self.router.read(state, q, g, self.heads, self.eps, lookahead=nxt, **kw)

    def read(self, state, i):
        return self._route(state, i)

    def write(self, state, i, out):
        return self.router.append(state, out)

    def readout(self, state):
        return self._route(state, self.n_sublayers)


class _BlockRouted(_Routed):
    """block_attnres: sublayer i is in block floor(i * blocks / 2L); sources = embedding, completed block
    sums, and the open block's partial sum (once it has an output)."""

    def __init__(self, config: MharConfig):
        super().__init__(config)
        self.heads = 1
        self.blocks = int(config.residual["blocks"])
        S = self.n_sublayers
        block_of = [i * self.blocks // S for i in range(S)]
        self.closes = frozenset(i for i in range(S) if i == S - 1 or block_of[i + 1] != block_of[i])

    def init(self, emb):
        return self.router.init(emb, capacity=self.blocks + 1), None

    def read(self, state, i):
        blocks, partial = state
        return self._route(blocks, i, extra=partial)

    def write(self, state, i, out):
        blocks, partial = state
        partial = out if partial is None else partial + out
        if i in self.closes:
            return self.router.append(blocks, partial), None
        return blocks, partial

    def readout(self, state):
        blocks, partial = state
        return self._route(blocks, self.n_sublayers, extra=partial)


class _HeadWise(_Residual):
    """mhar_hw: attention sublayer l reads G = num_key_value_heads single-head mixes (B, T, G, D), one
    per KV group; MLP sublayers and the final read one single-head mix."""

    def __init__(self, config: MharConfig):
        super().__init__(config)
        L, G, D = config.num_hidden_layers, config.num_key_value_heads, config.hidden_size
        self.attn_queries = nn.Parameter(torch.zeros(L, G, D))
        self.attn_key_norms = nn.Parameter(torch.ones(L, G, D))
        self.queries = nn.Parameter(torch.zeros(L + 1, D))
        self.key_norms = nn.Parameter(torch.ones(L + 1, D))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.attn_queries)
        nn.init.ones_(self.attn_key_norms)
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb):
        return self.router.init(emb, capacity=self.n_sublayers + 1)

    def _route(self, state, i):
        if i < self.n_sublayers and i % 2 == 0:
            qs, gs = self.attn_queries[i // 2], self.attn_key_norms[i // 2]
        else:
            j = self.config.num_hidden_layers if i >= self.n_sublayers else i // 2
            qs, gs = self.queries[j: j + 1], self.key_norms[j: j + 1]
        return [self.router.read(state, q, g, 1, self.eps) for q, g in zip(qs, gs)]

    def read(self, state, i):
        outs = self._route(state, i)
        return torch.stack(outs, dim=2) if i % 2 == 0 else outs[0]

    def write(self, state, i, out):
        return self.router.append(state, out)

    def readout(self, state):
        return self._route(state, self.n_sublayers)[0]


class _Delta(_Residual):
    """mhar_delta: stream x updated as in pre-norm; read i = x + alpha_i * route_i(null, block deltas)."""

    def __init__(self, config: MharConfig):
        super().__init__(config)
        r = config.residual
        self.heads = int(r["heads"])
        self.block_sublayers = 2 * int(r["delta_block_layers"])
        self.n_blocks = config.num_hidden_layers // int(r["delta_block_layers"])
        S, D = self.n_sublayers + 1, config.hidden_size
        self.null = nn.Parameter(torch.zeros(D))
        self.alphas = nn.Parameter(torch.zeros(S))
        self.queries = nn.Parameter(torch.zeros(S, D))
        self.key_norms = nn.Parameter(torch.ones(S, D))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.null)
        nn.init.zeros_(self.alphas)
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb):
        null = self.null.to(emb.dtype).expand(emb.shape)
        return emb, self.router.init(null, capacity=1 + self.n_blocks), emb  # (stream, sources, block start)

    def _gated(self, state, site):
        x, sources, _ = state
        q, g = self.queries[site], self.key_norms[site]
        nxt = (self.queries[site + 1:], self.key_norms[site + 1:]) if site < self.n_sublayers else None
        routed = self.router.read(sources, q, g, self.heads, self.eps, lookahead=nxt)
        return x + self.alphas[site].to(x.dtype) * routed

    def read(self, state, i):
        return self._gated(state, i)

    def write(self, state, i, out):
        x, sources, start = state
        x = x + out
        if (i + 1) % self.block_sublayers:
            return x, sources, start
        return x, self.router.append(sources, x - start), x

    def readout(self, state):
        return self._gated(state, self.n_sublayers)


class MharHyperConnection(nn.Module):
    """Hyper-connection of sublayer k: h = A_m^T H; H_new = A_r^T H + B^T out (static + dynamic parts)."""

    def __init__(self, d_model: int, n: int, k: int, dynamic: bool, eps: float):
        super().__init__()
        self.n, self.k, self.dynamic, self.eps = n, k, dynamic, eps
        self.static_alpha = nn.Parameter(torch.zeros(n, n + 1))  # [A_m | A_r]
        self.static_beta = nn.Parameter(torch.ones(n))  # B
        if dynamic:
            self.norm_weight = nn.Parameter(torch.ones(d_model))
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(d_model, n + 1))
            self.dynamic_alpha_scale = nn.Parameter(torch.full((), 0.01))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(d_model))
            self.dynamic_beta_scale = nn.Parameter(torch.full((), 0.01))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.static_alpha.zero_()
            self.static_alpha[self.k % self.n, 0] = 1.0
            self.static_alpha[:, 1:] = torch.eye(self.n)
            self.static_beta.fill_(1.0)
            if self.dynamic:
                self.norm_weight.fill_(1.0)
                self.dynamic_alpha_fn.zero_()
                self.dynamic_alpha_scale.fill_(0.01)
                self.dynamic_beta_fn.zero_()
                self.dynamic_beta_scale.fill_(0.01)

    def coefficients(self, H: Tensor) -> tuple[Tensor, Tensor]:
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        Hn = _rms_norm(H, self.norm_weight, self.eps)
        alpha = self.static_alpha + self.dynamic_alpha_scale * torch.tanh(Hn @ self.dynamic_alpha_fn)
        beta = self.static_beta + self.dynamic_beta_scale * torch.tanh(Hn @ self.dynamic_beta_fn)
        return alpha, beta


class _Hyper(_Residual):
    """hyper: n streams (B, T, n, D) starting as copies of the embedding; readout = their mean."""

    def __init__(self, config: MharConfig):
        super().__init__(config)
        r = config.residual
        self.n = int(r["hyper_n"])
        self.connections = nn.ModuleList(
            MharHyperConnection(config.hidden_size, self.n, k, bool(r["hyper_dynamic"]), config.rms_norm_eps)
            for k in range(self.n_sublayers))

    def reset_parameters(self) -> None:
        for hc in self.connections:
            hc.reset_parameters()

    def init(self, emb):
        return emb.unsqueeze(-2).expand(*emb.shape[:-1], self.n, emb.shape[-1]), None  # (streams, coefficients)

    def read(self, state, i):
        H, _ = state
        alpha, beta = self.connections[i].coefficients(H)
        a_m = alpha[..., 0]
        return torch.einsum("...j,...jd->...d", a_m.to(H.dtype), H), (alpha, beta)

    def write(self, state, i, out):
        H, (alpha, beta) = state
        a_r = alpha[..., 1:].to(H.dtype)
        skip = torch.einsum("...ji,...jd->...id", a_r, H)
        return skip + beta.to(H.dtype).unsqueeze(-1) * out.unsqueeze(-2), None

    def readout(self, state):
        return state[0].mean(-2)


_RESIDUALS = {"baseline": _Baseline, "attnres": _Routed, "mhar": _Routed, "block_attnres": _BlockRouted,
              "mhar_hw": _HeadWise, "mhar_delta": _Delta, "hyper": _Hyper}


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------
def _attention_mask(attention_mask: Optional[Tensor], B: int, T: int, past: int, device) -> Optional[Tensor]:
    """Boolean (B, 1, T, past + T) mask (True = attend), or None for a plain causal prefill."""
    S = past + T
    if attention_mask is not None and attention_mask.dim() == 4:  # already prepared by the caller
        m = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        return m | ~m.any(-1, keepdim=True)
    if attention_mask is not None and attention_mask.shape[-1] != S:
        raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions; expected {S} "
                         f"(the {past} cached ones plus the {T} new ones)")
    padded = attention_mask is not None and not bool(attention_mask.bool().all())
    if past == 0 and not padded:
        return None  # plain causal: SDPA's is_causal
    q_pos = torch.arange(T, device=device)[:, None] + past
    m = (torch.arange(S, device=device)[None, :] <= q_pos)[None, None]  # (1, 1, T, S)
    if padded:
        m = m & attention_mask.bool()[:, None, None, :]
    # a query row with nothing to attend to (a padding position before the text) attends to everything:
    # its output stays finite and no real position ever reads it
    return (m | ~m.any(-1, keepdim=True)).expand(B, 1, T, S)


class MharPreTrainedModel(PreTrainedModel):
    config_class = MharConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["MharModel"]  # the residual mixes every layer's outputs: keep them on one device
    _supports_cache_class = True
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight.normal_(mean=0.0, std=std)
        elif isinstance(module, MharRMSNorm):
            if not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight.fill_(1.0)
        elif isinstance(module, (_Residual, MharHyperConnection)):
            if not any(getattr(p, "_is_hf_initialized", False) for p in module.parameters(recurse=False)):
                module.reset_parameters()


class MharModel(MharPreTrainedModel):
    def __init__(self, config: MharConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MharDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = MharRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual = _RESIDUALS[config.residual["variant"]](config)
        self._inv_freq: dict[str, Tensor] = {}  # per device; not a buffer (computed, never loaded)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def _cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        key = str(positions.device)
        if key not in self._inv_freq:
            self._inv_freq[key] = rope_inv_freq(self.config).to(positions.device)
        freqs = positions.to(torch.float32)[..., None] * self._inv_freq[key]  # (B, T, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, hd)
        return emb.cos(), emb.sin()

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, cache=None, inputs_embeds: Optional[Tensor] = None,
                use_cache: Optional[bool] = None, past_key_values=None, **kwargs: Any) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        cache = cache if cache is not None else past_key_values
        if isinstance(cache, (tuple, list)):
            raise ValueError("legacy tuple caches are not supported: pass a transformers Cache (e.g. DynamicCache)")
        emb = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = emb.shape[:2]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None and DynamicCache is not None and not self.training:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            if attention_mask is not None and attention_mask.dim() == 2:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
            else:
                position_ids = torch.arange(past, past + T, device=emb.device)[None].expand(B, T)
        cos, sin = self._cos_sin(position_ids.expand(B, T))
        mask = _attention_mask(attention_mask, B, T, past, emb.device)
        res = self.residual
        res.begin(emb.device)
        state = res.init(emb)
        for i in range(2 * self.config.num_hidden_layers):
            layer = self.layers[i // 2]
            h = res.read(state, i)
            if isinstance(h, tuple):  # hyper: (input, coefficients the write reuses)
                h, coeffs = h
                state = (state[0], coeffs)
            if i % 2 == 0:
                out = layer.self_attn(layer.input_layernorm(h), cos, sin, mask, cache)
            else:
                out = layer.mlp(layer.post_attention_layernorm(h))
            state = res.write(state, i, out)
        hidden = self.norm(res.readout(state))
        return BaseModelOutputWithPast(last_hidden_state=hidden, **{_BASE_CACHE_FIELD: cache if use_cache else None})


class MharForCausalLM(MharPreTrainedModel, GenerationMixin):
    _tied_weights_keys = ({"lm_head.weight": "model.embed_tokens.weight"} if _TRANSFORMERS_MAJOR >= 5
                          else ["lm_head.weight"])

    def __init__(self, config: MharConfig):
        super().__init__(config)
        self.model = MharModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, cache=None, inputs_embeds: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, use_cache: Optional[bool] = None,
                logits_to_keep: int | Tensor = 0, past_key_values=None, return_dict: Optional[bool] = None,
                **kwargs: Any) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache)
        h = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(h[:, keep])
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: getattr(out, _BASE_CACHE_FIELD)})
        return result if return_dict is not False else result.to_tuple()


__all__ = ["MharConfig", "MharModel", "MharForCausalLM", "MharPreTrainedModel", "route", "TorchRouter"]
