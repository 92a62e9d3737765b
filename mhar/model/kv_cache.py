"""The static key/value cache of incremental decoding (``Transformer.hidden(ids, cache)``, ``mhar.model.inference``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


class KVCache:
    """Static keys/values of the positions already processed, for incremental decoding.

    ``k[l]`` / ``v[l]``: (B, n_kv, capacity, hd) per layer, after RoPE, before GQA repetition, allocated once
    (zeros) at the prefill and written in place: the prefill fills slots [0, T) of every row, a later step
    writes row b's new positions at ``pos[b], pos[b] + 1, ...``. Rows may have different lengths: the prefill
    takes right-padded input ids and each row's true length; a row's padded slots are masked until its own
    next tokens overwrite them. ``pos`` (B,) long: the next position of each row (= its filled slots).
    The capacity is ``capacity`` (default: the model's ``max_seq_len``, at least the prompt); an eager call that
    would pass it grows the buffers (a copy). ``mhar.model.inference`` pre-allocates and reuses one per batch size,
    so its CUDA graphs see fixed addresses.
    """

    def __init__(self, n_layers: int, capacity: Optional[int] = None):
        self.n_layers = n_layers
        self.capacity = capacity
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.pos: Optional[Tensor] = None
        self.empty = True  # the next call is the prefill
        self.filled = 0  # host-side bound on the filled slots of any row (eager calls only)
        self.managed = False  # True: the caller (mhar.model.inference) sized the buffers; no host bookkeeping

    @property
    def batch(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def reset(self) -> None:
        """Forget the cached positions (the buffers are kept for the next prefill)."""
        self.empty = True
        self.filled = 0

    def allocate(self, batch: int, n_kv: int, head_dim: int, capacity: int, device, dtype) -> None:
        """(Re)allocate zeroed buffers unless the present ones have this shape, device and dtype."""
        shape = (batch, n_kv, capacity, head_dim)
        if self.k and self.k[0].shape == shape and self.k[0].device == torch.device(device) \
                and self.k[0].dtype == dtype:
            return
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(self.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(self.n_layers)]
        self.pos = torch.zeros(batch, dtype=torch.long, device=device)

    def reserve(self, t_new: int) -> None:
        """Eager calls: make room for ``t_new`` more positions per row (grow by copying when needed)."""
        self.filled += t_new
        cap = self.k[0].shape[2]
        if self.filled <= cap:
            return
        new_cap = max(self.filled, 2 * cap)
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                grown = t.new_zeros(*t.shape[:2], new_cap, t.shape[3])
                grown[:, :, :cap] = t
                buf[i] = grown

    def layer(self, layer: int, positions: Optional[Tensor]) -> "AttnStep":
        """What layer ``layer``'s attention needs: its buffers and the new positions (None: the prefill)."""
        return AttnStep(self.k[layer], self.v[layer], positions)

    def keep_rows(self, rows: Tensor) -> None:
        """Drop finished rows (``rows``: indices of the rows to keep, in the new order)."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        if self.pos is not None:
            self.pos = self.pos.index_select(0, rows)


@dataclass
class AttnStep:
    """One layer's share of a cached call: its cache buffers (B, n_kv, capacity, hd), written in place, and the
    positions (B, T) of the new tokens (None: the prefill, slots [0, T), plain causal attention). No layer
    index: a compiled attention sublayer is one graph for every layer."""

    k: Tensor
    v: Tensor
    positions: Optional[Tensor]

    def write(self, k: Tensor, v: Tensor) -> None:
        if self.positions is None:
            T = k.shape[2]
            self.k[:, :, :T] = k
            self.v[:, :, :T] = v
            return
        B, kv, T, hd = k.shape
        idx = self.positions[:, None, :, None].expand(B, kv, T, hd)
        self.k.scatter_(2, idx, k)
        self.v.scatter_(2, idx, v)
