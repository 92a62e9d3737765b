"""Batches: token shards packed into consecutive windows of ``seq_len + 1`` tokens (no padding; windows share
one boundary token) and the paired batch order.

The batch order is a pure function of ``(data seed, number of sequences, global batch)``: every model variant
run with the same seed sees byte-identical batches, and the data position of a resumed run is just its step.
:func:`load_data` is the trainer's entry: shards (:func:`mhar.data.shards.build_shards`) -> :class:`TrainData`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from mhar.data.corpus import DataError
from mhar.data.shards import Shards, build_shards
from mhar.data.config import DataConfig

__all__ = ["PackedTokens", "BatchOrder", "TrainData", "load_data", "unigram_entropy"]


# --- packing and order ----------------------------------------------------------------------------
class PackedTokens:
    """A token stream cut into consecutive windows: sequence i = tokens[i*T : i*T + T + 1]."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise DataError(f"only {len(tokens)} tokens: not enough for one sequence of data.seq_len={seq_len}")

    def __len__(self) -> int:
        return self.n

    def get(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """Input ids and next-token labels, both (B, T) int64."""
        T = self.seq_len
        rows = np.stack([np.asarray(self.tokens[i * T: i * T + T + 1], dtype=np.int64) for i in idx])  # (B, T+1)
        rows_t = torch.from_numpy(rows)
        return rows_t[:, :-1].contiguous(), rows_t[:, 1:].contiguous()


class BatchOrder:
    """Which sequences form optimizer step ``s``: a pure function of (seed, n, global batch).

    Sample k of the run is sequence ``perm_e[k mod n]`` with ``e = k // n`` and ``perm_e`` a permutation
    drawn from ``numpy.random.default_rng([seed, e])``; step s takes samples ``[s*G, (s+1)*G)``.
    """

    def __init__(self, n: int, global_batch: int, seed: int):
        self.n, self.G, self.seed = n, global_batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def step_indices(self, step: int) -> np.ndarray:
        k = step * self.G + np.arange(self.G, dtype=np.int64)
        epochs, pos = k // self.n, k % self.n
        return np.array([self._perm(int(e))[p] for e, p in zip(epochs, pos)], dtype=np.int64)

    def rank_micro_batches(self, step: int, rank: int, world: int, micro: int) -> list[np.ndarray]:
        """Rank ``rank``'s contiguous share of the step, cut into micro-batches of ``micro`` sequences."""
        if self.G % (world * micro):
            raise DataError(f"train.global_batch={self.G} is not divisible by world_size*micro_batch={world * micro}")
        idx = self.step_indices(step)
        share = self.G // world
        mine = idx[rank * share:(rank + 1) * share]
        return [mine[i:i + micro] for i in range(0, share, micro)]


class TrainData:
    """Packed train/val sequences and the paired batch order of one run."""

    def __init__(self, shards: Shards, cfg: DataConfig, global_batch: int, seed: int):
        self.shards, self.cfg = shards, cfg
        self.train = PackedTokens(shards.train, cfg.seq_len)
        self.val = PackedTokens(shards.val, cfg.seq_len)
        self.order = BatchOrder(len(self.train), global_batch, seed)
        self.n_val = min(len(self.val), max(1, cfg.val_tokens // cfg.seq_len))

    def micro_batches(self, step: int, rank: int = 0, world: int = 1, micro: Optional[int] = None
                      ) -> Iterator[tuple[Tensor, Tensor]]:
        for idx in self.order.rank_micro_batches(step, rank, world, micro or self.order.G):
            yield self.train.get(idx)

    def val_batches(self, micro: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed validation set (first ``n_val`` sequences), strided over ranks."""
        idx = np.arange(self.n_val)[rank::world]
        for i in range(0, len(idx), micro):
            yield self.val.get(idx[i:i + micro])


def load_data(cfg: DataConfig, vocab_size: int, global_batch: int, seed: int,
              log: Callable[[str], None] = print) -> TrainData:
    return TrainData(build_shards(cfg, vocab_size, log), cfg, global_batch, seed)


def unigram_entropy(tokens: Iterable[int] | np.ndarray, minlength: int = 0) -> float:
    """Entropy (nats) of the empirical unigram distribution of a token stream."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=minlength).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
