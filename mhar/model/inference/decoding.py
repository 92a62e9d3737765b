"""Greedy decoding on a static KV cache, each step compiled and replayed as a CUDA graph (``Decoder``).

A static, pre-allocated KV cache (``mhar.model.kv_cache.KVCache``) per batch-size bucket; the prompt's prefill
runs the model's own router; every decode step (one token per row) runs the whole model on the new position
only, with the depth routing of the routed variants computed by ``mhar.model.routing.DecodeRouter`` (over this
position's own sources: O(N d) per read, each source's mean square kept from its append), compiled as one graph
(no graph break for any residual variant) and captured as a CUDA graph per (batch bucket, cache capacity),
replayed once per token; the next token's ids stay on the device and the host reads each step's tokens one step
behind (stop checks overlap the next step). CPU: the same step code eagerly (no graph), rows that stop leave the
batch.

:func:`generate` is the one greedy entry point (the lm-eval adapter's ``generate_until``, the benchmarks, the
tests): with the cache through the model's ``Decoder``; ``use_cache=False`` recomputes the whole sequence every
step (the reference path). Every path keeps its rows with one bookkeeping (``_Rows``), and the eager paths run
one loop (``_greedy_loop``); the CUDA-graph path reads the same tokens one step behind. The model module imports
nothing of this package (an export ships the model without the runner).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from mhar.model.inference.runner import CACHE_MULTIPLE, Runner, batch_bucket, round_up, runner_for, use_router
from mhar.model.kv_cache import KVCache
from mhar.model.routing import DecodeRouter


class _Rows:
    """Each row's new tokens and whether it goes on: a token in ``stop_ids`` ends a row (not kept);
    ``should_stop(row, generated)`` true ends it (the token that made it true is kept)."""

    def __init__(self, n: int, stop_ids: Sequence[int], should_stop: Optional[Callable[[int, list[int]], bool]]):
        self.gen: list[list[int]] = [[] for _ in range(n)]
        self.stop = set(int(t) for t in stop_ids)
        self.should_stop = should_stop

    def take(self, tokens: list[int], rows: list[int]) -> list[int]:
        """Append each row's token (``tokens[j]`` for ``rows[j]``); the positions (in ``rows``) still going."""
        keep = []
        for j, i in enumerate(rows):
            tok = tokens[j]
            if tok in self.stop:
                continue
            self.gen[i].append(tok)
            if self.should_stop is not None and self.should_stop(i, self.gen[i]):
                continue
            keep.append(j)
        return keep


def _greedy_loop(rows: _Rows, first: Tensor, step: Callable[[Tensor, list[int]], Tensor],
                 drop: Callable[[Tensor], None], max_new_tokens: int) -> list[list[int]]:
    """The greedy loop of the eager paths: ``first`` (one token per row), then for every token: keep it, let the
    rows that stopped leave (``drop(kept row indices)``), ``step(tokens of the active rows, active rows)`` -> the
    next tokens of those rows."""
    nxt, active = first, list(range(len(rows.gen)))
    for t in range(max_new_tokens):
        keep = rows.take(nxt.tolist(), active)
        if len(keep) != len(active):
            idx = torch.as_tensor(keep, dtype=torch.long, device=nxt.device)
            drop(idx)
            nxt = nxt.index_select(0, idx)
            active = [active[j] for j in keep]
        if not active or t == max_new_tokens - 1:
            break
        nxt = step(nxt, active)
    return rows.gen


def _last_states(model, seqs: list[list[int]], dev: torch.device) -> Tensor:
    """Hidden state (B, D) at the last token of each (right-padded) sequence, from the full forward."""
    lengths = torch.as_tensor([len(s) for s in seqs], dtype=torch.long, device=dev)
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    h = model.hidden(ids.to(dev))  # (B, T, D)
    return h[torch.arange(len(seqs), device=dev), lengths - 1]


@torch.no_grad()
def generate(model, contexts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
             should_stop: Optional[Callable[[int, list[int]], bool]] = None, use_cache: bool = True,
             max_length: Optional[int] = None) -> list[list[int]]:
    """Greedy continuation of each context (token lists of any lengths) by ``model`` (a
    ``mhar.model.transformer.Transformer``); returns the new tokens.

    A row stops at a token in ``stop_ids`` (not included), when ``should_stop(row, generated)`` is true (the
    token that made it true is kept), or after ``max_new_tokens``. With the cache (default) the decoding runs in
    the model's :class:`Decoder` (static KV cache; on CUDA each step compiled and replayed as a CUDA graph;
    settings: ``decoder_for(model, compile=..., cuda_graphs=...)``). ``use_cache=False`` recomputes the whole
    sequence every step (the reference path; then ``max_length`` left-truncates each step's input)."""
    if any(len(c) == 0 for c in contexts):
        raise ValueError("generate: every context needs at least one token")
    if use_cache:
        return decoder_for(model).generate(contexts, max_new_tokens, stop_ids, should_stop)
    rows = _Rows(len(contexts), stop_ids, should_stop)
    if not contexts or max_new_tokens <= 0:
        return rows.gen
    dev = model.embed.weight.device

    def next_tokens(active) -> Tensor:
        seqs = [list(contexts[i]) + rows.gen[i] for i in active]
        seqs = [s[-max_length:] for s in seqs] if max_length else seqs
        return model.lm_head(_last_states(model, seqs, dev)).float().argmax(-1)  # (B,)

    return _greedy_loop(rows, next_tokens(range(len(contexts))), lambda _nxt, active: next_tokens(active),
                        lambda _idx: None, max_new_tokens)


def _kv_dtype(model, device: torch.device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.embed.weight.dtype


class _Captured:
    """One CUDA graph of a decode step: static input ids (B, 1), output ids (B,), the cache it writes."""

    def __init__(self, graph, ids: Tensor, out: Tensor, cache: KVCache):
        self.graph, self.ids, self.out, self.cache = graph, ids, out, cache


class _EagerReplay:
    """Stands in for a CUDA graph off CUDA (``cuda_graphs="emulate"``): ``replay`` runs the step eagerly."""

    def __init__(self, dec: "Decoder", ids: Tensor, out: Tensor, cache: KVCache):
        self.dec, self.ids, self.out, self.cache = dec, ids, out, cache

    def replay(self) -> None:
        self.out.copy_(self.dec.run_step(self.ids, self.cache))
        self.ids.copy_(self.out[:, None])


class Decoder(Runner):
    """Greedy decoding of a ``mhar.model.transformer.Transformer`` (see the module docstring).

    ``compile`` (``Runner``): ``regional`` compiles each sublayer kind, the router's append and read and the
    head (a few small graphs shared by all layers), ``whole`` the whole step as one graph (more fusion, a much
    longer first compile). ``cuda_graphs``: capture the step. ``kernel``: the routed reads by the Triton decode
    kernel (``None``: on CUDA; see ``mhar.model.routing.DecodeRouter``)."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor",
                 kernel: Optional[bool] = None):
        super().__init__(model, compile, cuda_graphs, backend)
        self.kernel = kernel
        self._router: Optional[DecodeRouter] = None
        self._compiled: Optional[Callable] = None
        self._head: Optional[Callable] = None
        self._caches: dict[int, KVCache] = {}  # batch bucket -> pooled static cache (CUDA graphs)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "kernel": self.kernel}

    def clear(self) -> None:
        """Free the pooled caches and CUDA graphs."""
        self._caches.clear()
        super().clear()

    @property
    def router(self) -> DecodeRouter:
        if self._router is None:
            self._router = DecodeRouter(self._compile_fn if self.mode() == "regional" else None,
                                        kernel=self.kernel).resolve(self._device())
        return self._router

    # the step: one token per row through the whole model, depth routing by DecodeRouter
    def _step(self, ids: Tensor, cache: KVCache) -> Tensor:
        h = self.model.hidden(ids, cache)  # (B, 1, D)
        return self._argmax(h[:, -1])

    def _argmax_impl(self, h: Tensor) -> Tensor:
        return self.model.lm_head(h).float().argmax(-1)  # (B,)

    def _argmax(self, h: Tensor) -> Tensor:
        if self.mode() != "regional":
            return self._argmax_impl(h)
        if self._head is None:
            self._head = self._compile_fn(self._argmax_impl)
        return self._head(h)

    def run_step(self, ids: Tensor, cache: KVCache) -> Tensor:
        mode = self.mode()
        with use_router(self.model, self.router):
            if mode == "none":
                return self._step(ids, cache)
            if mode == "whole":
                if self._compiled is None:
                    self._compiled = self._compile_fn(self._step, fullgraph=True)
                return self._compiled(ids, cache)
            with self.regional(self.model):
                return self._step(ids, cache)

    def _pooled_cache(self, B: int, need: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        cfg = self.model.cfg
        cache = self._caches.get(B)
        cap = round_up(need, CACHE_MULTIPLE)
        if cache is None or cache.k[0].shape[2] < need or cache.k[0].dtype != dtype:
            for key in [k for k in self._graphs if k[0] == B]:
                del self._graphs[key]
            cache = KVCache(cfg.n_layers, cap)
            cache.allocate(B, cfg.n_kv_heads, cfg.resolved_head_dim, cap, device, dtype)
            cache.managed = True
            self._caches[B] = cache
        return cache

    def _capture(self, B: int, cache: KVCache) -> _Captured:
        key = (B, cache.k[0].shape[2])
        cap = self._graphs.get(key)
        if cap is not None:
            return cap
        dev = self._device()
        ids = torch.zeros(B, 1, dtype=torch.long, device=dev)
        if dev.type != "cuda":  # emulation (tests on CPU): the same bookkeeping, each replay runs the step eagerly
            out = torch.zeros(B, dtype=torch.long, device=dev)
            cap = self._graphs[key] = _Captured(_EagerReplay(self, ids, out, cache), ids, out, cache)
            return cap
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up (compilation, autotuning, allocator) outside the capture
            for _ in range(2):
                pos = cache.pos.clone()
                self.run_step(ids, cache)  # writes k/v at slots >= each row's length: masked, overwritten later
                cache.pos.copy_(pos)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.run_step(ids, cache)
            ids.copy_(out[:, None])  # replays chain on the device: the next step reads this step's tokens
        self.captures += 1
        cap = self._graphs[key] = _Captured(graph, ids, out, cache)
        return cap

    @torch.no_grad()
    def generate(self, contexts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 should_stop: Optional[Callable[[int, list[int]], bool]] = None) -> list[list[int]]:
        """Greedy continuation of each context; see :func:`generate`."""
        model = self.model
        rows = _Rows(len(contexts), stop_ids, should_stop)
        if any(len(c) == 0 for c in contexts):
            raise ValueError("generate: every context needs at least one token")
        if not contexts or max_new_tokens <= 0:
            return rows.gen
        dev = self._device()
        n = len(contexts)
        lengths = [len(c) for c in contexts]
        T = max(lengths)
        graphs = self.graphs()
        B = batch_bucket(n) if graphs else n
        dtype = _kv_dtype(model, dev)
        if graphs:
            cache = self._pooled_cache(B, T + max_new_tokens, dev, dtype)
        else:
            cache = KVCache(model.cfg.n_layers, T + max_new_tokens)
        cache.reset()
        ids = torch.zeros(B, T, dtype=torch.long)
        lens = torch.ones(B, dtype=torch.long)  # bucket padding rows: one token, decoded and ignored
        for r, c in enumerate(contexts):
            ids[r, : len(c)] = torch.as_tensor(list(c), dtype=torch.long)
            lens[r] = len(c)
        lens = lens.to(dev)
        h = model.hidden(ids.to(dev), cache, lens)  # the prefill, with the model's own router
        nxt = model.lm_head(h[torch.arange(B, device=dev), lens - 1]).float().argmax(-1)  # (B,)
        del h

        if not graphs:
            return _greedy_loop(rows, nxt, lambda tokens, _active: self.run_step(tokens[:, None], cache),
                                cache.keep_rows, max_new_tokens)

        # CUDA graphs: all B rows step together (finished and padding rows are ignored); the host reads the
        # tokens of step t - 1 while step t runs
        cap = self._capture(B, cache)
        cap.ids.copy_(nxt[:, None])
        cuda = dev.type == "cuda"
        host = torch.empty(max_new_tokens, B, dtype=torch.long, pin_memory=cuda)
        events: list[Any] = []

        def enqueue_read(t: int, src: Tensor) -> None:
            host[t].copy_(src, non_blocking=cuda)
            ev = torch.cuda.Event() if cuda else None
            if ev is not None:
                ev.record()
            events.append(ev)

        enqueue_read(0, nxt)
        still = list(range(n))
        for t in range(1, max_new_tokens + 1):
            if t < max_new_tokens:
                cap.graph.replay()
                enqueue_read(t, cap.out)
            if events[t - 1] is not None:
                events[t - 1].synchronize()
            toks = host[t - 1].tolist()
            keep = rows.take([toks[i] for i in still], still)
            still = [still[j] for j in keep]
            if not still:
                break
        if cuda:
            torch.cuda.current_stream(dev).synchronize()
        return rows.gen


def decoder_for(model, **settings) -> Decoder:
    """The model's decoder (created on first use; ``settings`` replace the current ones and drop its graphs)."""
    return runner_for(model, "_mhar_decoder", Decoder, settings)


__all__ = ["Decoder", "decoder_for", "generate"]
