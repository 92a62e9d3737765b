"""Hugging Face ``transformers`` classes over the harness's own decoder (``mhar.model.transformer.Transformer``).

An export of a variant other than the plain baseline ships this file as ``modeling_mhar.py`` together with the
harness's model modules, flattened (:mod:`mhar.hf.ship`), so it loads where ``mhar`` is not installed::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
    out = model.generate(**tok("The cat", return_tensors="pt"), max_new_tokens=20, do_sample=False)

The model is the harness's ``Transformer``; its modules are registered here under Qwen3's names
(:data:`mhar.hf.names.TOP_MODULES`, ``LAYER_MODULES``), so the state dict is the export's ``model.safetensors``.
``routing_impl``: ``auto`` (the ``mhar`` fused kernels on a GPU where ``mhar`` is installed, else the shipped
PyTorch reference), ``torch`` (the reference), or a ``mhar.model.routing`` name (``fused`` needs ``mhar``).

Padding: each row's tokens must be contiguous (left padding, as ``generate`` uses, or right padding). A padded
batch runs as the harness runs ragged rows: each row shifted to start at position 0, with its own length.
Cache: ``generate`` passes a ``transformers`` ``Cache`` (a ``DynamicCache``); it carries the harness's
``KVCache`` (static keys/values, one next position per row) and, in its layer 0, one (row index) entry per
token, so ``get_seq_length`` counts the padded columns and a reordering of rows (beam search) reaches the
``KVCache`` too.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Optional

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from mhar.hf.names import LAYER_MODULES, TOP_MODULES, model_config_from_mhar_fields
from mhar.model.residuals import RESIDUALS
from mhar.model.kv_cache import KVCache
from mhar.model.transformer import Rotary, Transformer, lm_loss, rope_frequencies

# transformers 5 renamed the cache argument / output field from ``past_key_values`` to ``cache``
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_TIED = {"lm_head.weight": "model.embed_tokens.weight"}


class MharConfig(PretrainedConfig):
    """Qwen3's config fields, plus ``residual`` (the harness's residual config), ``rope_llama3`` (Llama-3
    frequency scaling or None), ``qk_norm``, ``routing_impl`` (how this process runs the routing) and
    ``mhar_routing_impl`` (how the model was trained; an import back into the harness restores it)."""

    model_type = "mhar"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, vocab_size: int = 257, hidden_size: int = 64, intermediate_size: int = 192,
                 num_hidden_layers: int = 2, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                 head_dim: Optional[int] = None, max_position_embeddings: int = 2048, rope_theta: float = 10000.0,
                 rope_llama3: Optional[dict] = None, rms_norm_eps: float = 1e-6, initializer_range: float = 0.02,
                 qk_norm: bool = True, hidden_act: str = "silu", residual: Optional[dict] = None,
                 routing_impl: str = "auto", mhar_routing_impl: str = "eager", use_cache: bool = True,
                 tie_word_embeddings: bool = True, **kwargs: Any):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings, self.rope_theta = max_position_embeddings, float(rope_theta)
        self.rope_llama3 = dict(rope_llama3) if rope_llama3 else None
        self.rms_norm_eps, self.initializer_range, self.qk_norm = rms_norm_eps, initializer_range, qk_norm
        self.hidden_act = hidden_act
        self.residual = dict(residual or {})
        self.routing_impl, self.mhar_routing_impl, self.use_cache = routing_impl, mhar_routing_impl, use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def model_config(self):
        """The harness's ``ModelConfig`` of this model, built with this process's routing implementation."""
        if self.hidden_act != "silu":
            raise ValueError(f"MharConfig: hidden_act must be 'silu' (SwiGLU), got {self.hidden_act!r}")
        fields = self.to_dict()
        residual = fields["residual"] = dict(fields.get("residual") or {})
        if residual.get("variant") in RESIDUALS:  # registered already (a shipped variant module): not imported again
            residual.pop("module", None)
        return model_config_from_mhar_fields(fields, routing_impl=_routing_impl(self.routing_impl))


def _routing_impl(impl: str) -> str:
    """``routing_impl`` of the config -> the harness's name: ``torch`` is the reference (``eager``); ``auto`` and the
    kernels need the ``mhar`` package (the fused kernels are not shipped)."""
    if impl == "torch":
        return "eager"
    try:
        have_mhar = importlib.util.find_spec("mhar") is not None
    except ImportError:  # a finder that refuses it
        have_mhar = False
    if impl == "auto":
        return "auto" if have_mhar else "eager"
    if impl != "eager" and not have_mhar:
        raise ImportError(f"routing_impl={impl!r} needs the mhar package (pip install mhar); set routing_impl='torch' "
                          "(or 'auto') to use the shipped PyTorch routing")
    return impl


class _Named(nn.Module):
    """Modules of the harness model registered under other names (no parameters of its own)."""

    def __init__(self, owner: nn.Module, names: dict[str, str]):
        super().__init__()
        for ours, theirs in names.items():
            self.add_module(theirs, getattr(owner, ours))


class MharPreTrainedModel(PreTrainedModel):
    config_class = MharConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["MharForCausalLM"]  # the residual mixes every layer's outputs: keep them on one device
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        # the harness model initialises its parameters itself; the RoPE table is computed, never loaded
        if isinstance(module, Rotary):
            with torch.no_grad():
                module.inv_freq.copy_(rope_frequencies(module.cfg))


class MharForCausalLM(MharPreTrainedModel, GenerationMixin):
    _tied_weights_keys = _TIED

    def __init__(self, config: MharConfig):
        super().__init__(config)
        decoder = Transformer(config.model_config())
        self.__dict__["decoder"] = decoder  # not a submodule: its modules are registered below, by their HF names
        self.model = nn.Module()
        for ours, theirs in TOP_MODULES.items():
            parent, _, name = theirs.rpartition(".")
            (self.model if parent == "model" else self).add_module(name, getattr(decoder, ours))
        self.model.layers = nn.ModuleList(_Named(block, LAYER_MODULES) for block in decoder.layers)
        self.model.rotary = decoder.rotary
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None, cache=None,
                labels: Optional[Tensor] = None, use_cache: Optional[bool] = None, logits_to_keep: int | Tensor = 0,
                past_key_values=None, inputs_embeds: Optional[Tensor] = None, return_dict: Optional[bool] = None,
                **kwargs: Any) -> CausalLMOutputWithPast:
        """Logits (B, T, V) of ``input_ids`` (B, T); ``labels``: the inputs (shifted here, -100 ignored)."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("MharForCausalLM takes input_ids (the harness model embeds them itself)")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None and not self.training:
            cache = DynamicCache(config=self.config)
        h = self._hidden(input_ids, attention_mask, cache if use_cache else None)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(h[:, keep])
        loss = None
        if labels is not None:
            loss = lm_loss(logits[:, :-1], labels[:, 1:].to(logits.device))[0]  # transformers' labels: unshifted
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache if use_cache else None})
        return out if return_dict is not False else out.to_tuple()

    def _hidden(self, ids: Tensor, mask: Optional[Tensor], cache) -> Tensor:
        """Final-normed hidden states (B, T, D) in the caller's (left-padded) layout."""
        B, T = ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        padding = _padding(mask, past, T)
        if cache is not None:
            rows = torch.arange(B, device=ids.device, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 1, T, 1)
            track, _ = cache.update(rows, rows, 0)
        if past == 0 or cache is None:
            kv = None
            if cache is not None:
                kv = cache.mhar_kv = KVCache(self.config.num_hidden_layers, capacity=T)  # grows by doubling
            if padding is None:
                return self.decoder.hidden(ids, kv)
            lead, length = padding  # each row shifted to start at position 0 (right-padded), and back
            return _shift(self.decoder.hidden(_shift(ids, -lead), kv, lengths=length), lead)
        kv = getattr(cache, "mhar_kv", None)
        if kv is None:
            raise ValueError("this cache holds positions this model did not compute; pass a new cache")
        order = track[:, 0, past - 1, 0].long()  # the rows as the cache holds them now (beam search reorders)
        if not torch.equal(order, torch.arange(kv.batch, device=order.device)):
            kv.keep_rows(order.to(kv.pos.device))
        return self.decoder.hidden(ids, kv)


def _padding(mask: Optional[Tensor], past: int, T: int) -> Optional[tuple[Tensor, Tensor]]:
    """(padding columns before each row's tokens, the row's token count), both (B,), for a first call with
    padding; None without any (or on a later call). Refuses a row whose tokens are not contiguous."""
    if mask is None:
        return None
    if mask.dim() != 2 or mask.shape[-1] != past + T:
        raise ValueError(f"attention_mask must be (batch, {past + T}): the {past} cached and {T} new positions")
    m = mask.bool()
    if past:
        if not bool(m[:, past:].all()):
            raise ValueError("attention_mask: a token after the cached positions cannot be padding")
        return None
    lead = (~m).long().cumprod(-1).sum(-1)  # (B,)
    length = m.sum(-1)
    cols = torch.arange(T, device=m.device)[None, :]
    if not torch.equal(m, (cols >= lead[:, None]) & (cols < (lead + length)[:, None])):
        raise ValueError("attention_mask: each row's tokens must be contiguous (padding before or after them)")
    return (lead, length) if bool(m.logical_not().any()) else None


def _shift(x: Tensor, by: Tensor) -> Tensor:
    """Roll row b of ``x`` (B, T, ...) by ``by[b]`` positions along T (zeros where nothing lands)."""
    T = x.shape[1]
    src = torch.arange(T, device=x.device)[None, :] - by.to(x.device)[:, None]  # (B, T) source column of each column
    valid = (src >= 0) & (src < T)
    idx = src.clamp(0, T - 1)
    idx = idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x)
    out = x.gather(1, idx)
    return out * valid.view(*valid.shape, *([1] * (x.dim() - 2))).to(out.dtype)


__all__ = ["MharConfig", "MharForCausalLM", "MharPreTrainedModel"]
