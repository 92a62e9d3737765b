"""Inference at training speed: log-likelihood scoring and greedy decoding, compiled and CUDA-graph captured.

Two entry points, both used by ``Transformer.generate`` / ``eval.adapter.MharLM`` and timed by
``benchmarks/bench_inference.py``:

* :class:`Scorer` (the log-likelihood requests lm-eval sends): hidden states of right-padded batches through a
  ``torch.compile``'d ``Transformer.hidden`` (on CUDA by default; the sequence length is padded to a multiple
  of ``T_MULTIPLE`` and marked dynamic, the batch padded to a power of two, so a run compiles once per batch
  bucket and not per batch), then the output head only on the scored positions, in chunks, with the
  log-softmax, the target's log-probability and the greedy check fused into one pass over the logits (the
  (positions, vocabulary) fp32 block of the eager path is never written). Under ``no_grad`` nothing is saved
  for a backward pass. Routers that dynamo cannot trace run the hidden states eagerly.
* :class:`Decoder` (``generate``): a static, pre-allocated KV cache (``mhar.model.KVCache``) per batch-size
  bucket; the prompt's prefill runs the model's own router; every decode step (one token per row) runs the
  whole model on the new position only, with the depth routing of the routed variants computed by
  :class:`InferenceRouter` (plain PyTorch over this position's own sources: O(N d) per read, each source's
  mean square kept from its append), compiled as one graph (no graph break for any residual variant) and
  captured as a CUDA graph per (batch bucket, cache capacity), replayed once per token; the next token's ids
  stay on the device and the host reads each step's tokens one step behind (stop checks overlap the next
  step). CPU: the same step code eagerly (no graph), rows that stop leave the batch.

The paths compute what the eager full forward computes (tests/test_inference.py: per-sample log-likelihoods
and greedy generations for every residual variant; fp32 on CPU, bf16 on the GPU within 1e-2 on per-sample sums).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import KVCache
from .routing import Router

__all__ = ["InferenceRouter", "Decoder", "Scorer", "decoder_for", "scorer_for", "batch_bucket", "T_MULTIPLE",
           "CACHE_MULTIPLE", "HEAD_CHUNK", "use_router", "traceable_router"]

T_MULTIPLE = 64  # compiled scoring pads the sequence length to a multiple of this (one dynamic-T graph)
CACHE_MULTIPLE = 256  # decode cache capacity granularity (one CUDA graph per batch bucket and capacity)
HEAD_CHUNK = 2048  # scored positions per output-head call: bounds the (positions, vocabulary) logits block


def batch_bucket(n: int) -> int:
    """The power of two >= n (batch sizes that share one compiled graph / CUDA graph)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _round_up(x: int, m: int) -> int:
    return -(-int(x) // m) * m


def _auto(value: Any, default: bool, name: str) -> bool:
    if value in (None, "auto"):
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}: expected auto, true or false, got {value!r}")


def _raise_dynamo_limits() -> None:
    # one graph per batch bucket / cache capacity is expected: dynamo's default of 8 would fall back to eager
    for name, val in (("cache_size_limit", 256), ("recompile_limit", 256)):
        if hasattr(torch._dynamo.config, name) and getattr(torch._dynamo.config, name) < val:
            setattr(torch._dynamo.config, name, val)


# --- depth routing of a few positions --------------------------------------------------------------------
class InferenceRouter(Router):
    """The routing of ``mhar.routing.reference`` for inference on a few positions (a decode step): plain
    PyTorch that dynamo traces, so a compiled decode step is one graph for every routed variant.

    State: the sources (each (B, T, D), a (D,) null source broadcast) and each one's mean square over D in
    fp32, computed once at its append (the reference recomputes it at every read). A read is
    ``softmax_n(rsqrt(ms_n + eps) * <s_n[h], (g q)[h]>)`` per head, mixed over the sources in fp32: the same
    function as ``route_reference`` (the product's order differs: equal to rounding)."""

    name = "inference"
    traceable = True

    @staticmethod
    def _ms(src: Tensor) -> Tensor:
        return src.float().pow(2).mean(-1, keepdim=True)  # (..., 1) fp32

    def init(self, first: Tensor, capacity: int):
        return ((first,), (self._ms(first),))

    def append(self, state, src: Tensor):
        srcs, ms = state
        return (srcs + (src,), ms + (self._ms(src),))

    def num_sources(self, state) -> int:
        return len(state[0])

    def read(self, state, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6, *,
             extra: Optional[Tensor] = None, return_weights: bool = False, lookahead=None, prenorm=None):
        srcs, ms = state
        if extra is not None:
            srcs, ms = srcs + (extra,), ms + (self._ms(extra),)
        shape = torch.broadcast_shapes(*(s.shape for s in srcs))  # a learnable null source broadcasts
        B, T, D = shape
        H, N = num_heads, len(srcs)
        S = torch.stack([s.expand(shape) for s in srcs]).float().view(N, B, T, H, D // H)
        M = torch.stack([m.expand(B, T, 1) for m in ms])  # (N, B, T, 1)
        gq = (norm_weight.float() * query.float()).view(H, D // H)
        scores = (S * gq).sum(-1) * torch.rsqrt(M + eps)  # (N, B, T, H)
        w = torch.softmax(scores, dim=0)
        out = (w.unsqueeze(-1) * S).sum(0).reshape(B, T, D).to(srcs[-1].dtype if extra is None else extra.dtype)
        if prenorm is not None:
            out = prenorm(out)
        if return_weights:
            return out, w.permute(1, 2, 3, 0).contiguous()
        return out


def traceable_router(model) -> bool:
    """Whether dynamo traces the model's routing (no router, eager / compile, or a router marked traceable)."""
    router = getattr(getattr(model, "residual", None), "router", None)
    return router is None or bool(getattr(router, "traceable", getattr(router, "name", "") in ("eager", "compile")))


@contextlib.contextmanager
def use_router(model, router: Optional[Router]):
    """Run the model's residual with ``router`` (None: unchanged) for the duration of the block."""
    res = getattr(model, "residual", None)
    if router is None or not hasattr(res, "router"):
        yield
        return
    saved = res.router
    res.router = router
    try:
        yield
    finally:
        res.router = saved


def _kv_dtype(model, device: torch.device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.embed.weight.dtype


# --- decoding ----------------------------------------------------------------------------------------------
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


class Decoder:
    """Greedy decoding of a ``mhar.model.Transformer`` (see the module docstring).

    ``compile``: compile the decode step (``auto``: on CUDA); ``cuda_graphs``: capture it (``auto``: on CUDA);
    ``backend``: the ``torch.compile`` backend (``inductor``; tests use ``aot_eager``)."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor"):
        self.model = model
        self.compile_opt, self.graphs_opt, self.backend = compile, cuda_graphs, backend
        self.router = InferenceRouter()
        self._compiled: Optional[Callable] = None
        self._caches: dict[int, KVCache] = {}  # batch bucket -> pooled static cache (CUDA graphs)
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self.captures = 0  # CUDA graphs captured so far (tests, logs)

    # settings resolved for the model's device
    def _device(self) -> torch.device:
        return self.model.embed.weight.device

    def compiled(self) -> bool:
        return _auto(self.compile_opt, self._device().type == "cuda", "compile")

    def graphs(self) -> bool:
        """Whether decode steps run as captured graphs (``emulate``: the same bookkeeping on any device, each
        replay an eager call of the step; for tests of the graph path on CPU)."""
        if self.graphs_opt == "emulate":
            return True
        want = _auto(self.graphs_opt, self._device().type == "cuda", "cuda_graphs")
        if want and self._device().type != "cuda":
            raise ValueError("cuda_graphs=true needs the model on a CUDA device")
        return want

    def clear(self) -> None:
        """Free the pooled caches and CUDA graphs."""
        self._caches.clear()
        self._graphs.clear()

    # the step: one token per row through the whole model, depth routing by InferenceRouter
    def _step(self, ids: Tensor, cache: KVCache) -> Tensor:
        h = self.model.hidden(ids, cache)  # (B, 1, D)
        return self.model.lm_head(h[:, -1]).float().argmax(-1)  # (B,)

    def step_fn(self) -> Callable[[Tensor, KVCache], Tensor]:
        if not self.compiled():
            return self._step
        if self._compiled is None:
            _raise_dynamo_limits()
            self._compiled = torch.compile(self._step, fullgraph=True, dynamic=False, backend=self.backend)
        return self._compiled

    def run_step(self, ids: Tensor, cache: KVCache) -> Tensor:
        with use_router(self.model, self.router):
            return self.step_fn()(ids, cache)

    def _pooled_cache(self, B: int, need: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        cfg = self.model.cfg
        cache = self._caches.get(B)
        cap = _round_up(need, CACHE_MULTIPLE)
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
        """Greedy continuation of each context; see ``Transformer.generate``."""
        model = self.model
        gen: list[list[int]] = [[] for _ in contexts]
        if any(len(c) == 0 for c in contexts):
            raise ValueError("generate: every context needs at least one token")
        if not contexts or max_new_tokens <= 0:
            return gen
        dev = self._device()
        stop = set(int(t) for t in stop_ids)
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
        active = list(range(n))

        def take(tokens: list[int], rows: list[int]) -> list[int]:
            """Append each active row's token; return the positions (in ``rows``) of the rows still going."""
            keep = []
            for j, i in enumerate(rows):
                tok = tokens[j]
                if tok in stop:
                    continue
                gen[i].append(tok)
                if should_stop is not None and should_stop(i, gen[i]):
                    continue
                keep.append(j)
            return keep

        if not graphs:
            for t in range(max_new_tokens):
                keep = take(nxt.tolist(), active)
                if len(keep) != len(active):
                    rows = torch.as_tensor(keep, dtype=torch.long, device=dev)
                    cache.keep_rows(rows)
                    nxt = nxt.index_select(0, rows)
                    active = [active[j] for j in keep]
                if not active or t == max_new_tokens - 1:
                    break
                nxt = self.run_step(nxt[:, None], cache)
            return gen

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
        still = list(active)
        for t in range(1, max_new_tokens + 1):
            if t < max_new_tokens:
                cap.graph.replay()
                enqueue_read(t, cap.out)
            if events[t - 1] is not None:
                events[t - 1].synchronize()
            toks = host[t - 1].tolist()
            keep = take([toks[i] for i in still], still)
            still = [still[j] for j in keep]
            if not still:
                break
        if cuda:
            torch.cuda.current_stream(dev).synchronize()
        return gen


# --- scoring -----------------------------------------------------------------------------------------------
def _head_logprobs(model, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(log p(target) fp32 (N,), target is the argmax (N,)) from states h (N, D); compiled, one pass over the
    logits (the fp32 log-softmax is fused into the gather and the argmax)."""
    lp = F.log_softmax(model.lm_head(h).float(), dim=-1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), lp.argmax(-1) == targets


class Scorer:
    """Hidden states and target log-probabilities for log-likelihood scoring (see the module docstring).

    ``compile``: ``auto`` = on CUDA; ``backend``: the ``torch.compile`` backend."""

    def __init__(self, model, compile: Any = "auto", backend: str = "inductor"):
        self.model = model
        self.compile_opt, self.backend = compile, backend
        self._hidden_c: Optional[Callable] = None
        self._head_c: Optional[Callable] = None

    def compiled(self) -> bool:
        return _auto(self.compile_opt, self.model.embed.weight.device.type == "cuda", "compile")

    def hidden(self, ids: Tensor) -> Tensor:
        """Final-normed states (B, T, D) of right-padded ids (B, T) (the padding only follows the read ones)."""
        if not (self.compiled() and traceable_router(self.model)):
            return self.model.hidden(ids)
        B, T = ids.shape
        Bp, Tp = batch_bucket(B), max(T_MULTIPLE, _round_up(T, T_MULTIPLE))
        if (Bp, Tp) != (B, T):
            padded = ids.new_zeros(Bp, Tp)
            padded[:B, :T] = ids
            ids = padded
        if self._hidden_c is None:
            _raise_dynamo_limits()
            self._hidden_c = torch.compile(self.model.hidden, backend=self.backend)
        torch._dynamo.mark_dynamic(ids, 1)
        return self._hidden_c(ids)[:B, :T]

    def token_logprobs(self, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(log-probabilities fp32 (N,), greedy flags (N,)) of ``targets`` (N,) after states ``h`` (N, D)."""
        fn = lambda x, t: _head_logprobs(self.model, x, t)  # noqa: E731
        if self.compiled():
            if self._head_c is None:
                _raise_dynamo_limits()
                self._head_c = torch.compile(_head_logprobs, backend=self.backend)
            fn = lambda x, t: self._head_c(self.model, x, t)  # noqa: E731
        lps, greedy = [], []
        for s in range(0, h.shape[0], HEAD_CHUNK):
            x, t = h[s: s + HEAD_CHUNK], targets[s: s + HEAD_CHUNK]
            if self.compiled() and x.shape[0] > 1:
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(t, 0)
            lp, g = fn(x, t)
            lps.append(lp)
            greedy.append(g)
        return torch.cat(lps), torch.cat(greedy)

    @torch.no_grad()
    def sequence_logprobs(self, ids: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
        """Per-row sum of log p(ids[t+1] | ids[:t+1]) over each row's true length (fp32 (B,)): the scoring of
        whole right-padded sequences (lm-eval's rolling windows), as the adapter runs it."""
        B, T = ids.shape
        lengths = torch.full((B,), T) if lengths is None else lengths.cpu()
        h = self.hidden(ids)
        mask = torch.arange(T - 1)[None, :] < (lengths[:, None] - 1)  # positions that predict a real token
        idx = mask.flatten().nonzero().squeeze(-1).to(ids.device)
        lp, _ = self.token_logprobs(h[:, :-1].reshape(-1, h.shape[-1]).index_select(0, idx),
                                    ids[:, 1:].reshape(-1).index_select(0, idx))
        rows = torch.arange(B).repeat_interleave(lengths - 1).to(ids.device)
        return torch.zeros(B, device=ids.device, dtype=torch.float32).index_add_(0, rows, lp)


def decoder_for(model, **settings) -> Decoder:
    """The model's decoder (created on first use; ``settings`` replace the current ones and drop its graphs)."""
    dec = getattr(model, "_mhar_decoder", None)
    if dec is None or settings:
        old = {} if dec is None else {"compile": dec.compile_opt, "cuda_graphs": dec.graphs_opt,
                                      "backend": dec.backend}
        dec = Decoder(model, **{**old, **settings})
        object.__setattr__(model, "_mhar_decoder", dec)
    return dec


def scorer_for(model, **settings) -> Scorer:
    """The model's scorer (created on first use; ``settings`` replace the current ones)."""
    sc = getattr(model, "_mhar_scorer", None)
    if sc is None or settings:
        old = {} if sc is None else {"compile": sc.compile_opt, "backend": sc.backend}
        sc = Scorer(model, **{**old, **settings})
        object.__setattr__(model, "_mhar_scorer", sc)
    return sc
