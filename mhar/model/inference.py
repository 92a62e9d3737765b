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
* :class:`Decoder` (``generate``): a static, pre-allocated KV cache (``mhar.model.transformer.KVCache``) per batch-size
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
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mhar.model.transformer import KVCache
from mhar.model.routing import Router

__all__ = ["InferenceRouter", "Decoder", "Scorer", "decoder_for", "scorer_for", "batch_bucket",
           "CACHE_MULTIPLE", "HEAD_CHUNK", "score_length_bucket", "use_router", "traceable_router"]

CACHE_MULTIPLE = 128  # decode cache capacity granularity (one CUDA graph per batch bucket and capacity)
HEAD_CHUNK = 1024  # scored positions per output-head call: bounds the (positions, vocabulary) logits block


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


def _graphs_wanted(opt: Any, device: torch.device) -> bool:
    """The ``cuda_graphs`` option on ``device`` (``emulate``: the graph bookkeeping on any device, for tests)."""
    if opt == "emulate":
        return True
    want = _auto(opt, device.type == "cuda", "cuda_graphs")
    if want and device.type != "cuda":
        raise ValueError("cuda_graphs=true needs the model on a CUDA device")
    return want


def _compile(fn: Callable, backend: str, **kwargs: Any) -> Callable:
    """``torch.compile`` for inference: inductor keeps eager's 16-bit roundings between fused operations
    (``emulate_precision_casts``), so compiled bf16 results follow the eager path's (tests: per-sample sums)."""
    _raise_dynamo_limits()
    if backend == "inductor":
        kwargs["options"] = {"emulate_precision_casts": True}
    return torch.compile(fn, backend=backend, **kwargs)


def _raise_dynamo_limits() -> None:
    # one graph per batch bucket / cache capacity is expected: dynamo's default of 8 would fall back to eager
    for name, val in (("cache_size_limit", 256), ("recompile_limit", 256)):
        if hasattr(torch._dynamo.config, name) and getattr(torch._dynamo.config, name) < val:
            setattr(torch._dynamo.config, name, val)


# --- depth routing of a few positions --------------------------------------------------------------------
def _append_impl(buf: Tensor, ms: Tensor, src: Tensor, n: Tensor) -> None:
    """Write source ``src`` (B, T, D), or a broadcast one, into slot ``n`` (0-dim long tensor) of ``buf``
    (cap, B, T, D), and its mean square over D (fp32) into ``ms`` (cap, B, T, 1)."""
    src = src.expand(buf.shape[1:])
    idx = n.view(1)
    buf.index_copy_(0, idx, src.to(buf.dtype).unsqueeze(0))
    ms.index_copy_(0, idx, src.float().pow(2).mean(-1, keepdim=True).unsqueeze(0))


def _read_impl(buf: Tensor, ms: Tensor, n: Tensor, q: Tensor, g: Tensor, H: int, eps: float,
               extra: Optional[Tensor], pending: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """The routed read over the first ``n`` slots of ``buf`` (+ ``pending``, written to slot n first, + ``extra``):
    every slot is scored (a fixed shape for every read, so one compiled graph serves all of a model's reads);
    unwritten slots get weight exactly 0."""
    if pending is not None:
        _append_impl(buf, ms, pending, n)
        n = n + 1
    cap, B, T, D = buf.shape
    S = buf.float().view(cap, B, T, H, D // H)
    gq = (g.float() * q.float()).view(H, D // H)
    scores = (S * gq).sum(-1) * torch.rsqrt(ms + eps)  # (cap, B, T, H)
    scores = scores.masked_fill((torch.arange(cap, device=buf.device) >= n).view(cap, 1, 1, 1), float("-inf"))
    if extra is not None:
        E = extra.float().view(1, B, T, H, D // H)
        es = (E * gq).sum(-1) * torch.rsqrt(extra.float().pow(2).mean(-1, keepdim=True) + eps)
        S, scores = torch.cat([S, E]), torch.cat([scores, es])
    w = torch.softmax(scores, dim=0)
    out = (w.unsqueeze(-1) * S).sum(0).reshape(B, T, D).to(buf.dtype)
    return out, w


class _Sources:
    """InferenceRouter state: a fixed-capacity source buffer, the mean squares, the slots written (host int)
    and the newest source, appended but not yet written (the next read writes it)."""

    __slots__ = ("buf", "ms", "n", "pending")

    def __init__(self, buf: Tensor, ms: Tensor, n: int, pending: Optional[Tensor] = None):
        self.buf, self.ms, self.n, self.pending = buf, ms, n, pending


class InferenceRouter(Router):
    """The routing of ``mhar.model.routing.reference`` for inference on a few positions (a decode step).

    State: one (capacity, B, T, D) buffer of this position's sources, each written once, and each source's
    mean square over D in fp32, computed once when it is written (the reference recomputes it at every read):
    a read costs O(N d) per token. An append only records the source; the next read writes it (a decode step
    has no launch per append). A read is ``softmax_n(rsqrt(ms_n + eps) * <s_n[h], (g q)[h]>)`` per head, mixed
    over the sources in fp32: ``route_reference``'s function (the products' order differs: equal to rounding).

    Two implementations of the read: ``kernel=True`` (default on CUDA with Triton): one launch of
    ``mhar.model.routing.decode.decode_read`` (the custom op ``mhar::decode_read``); else the PyTorch expression
    ``_read_impl`` (plain operations dynamo traces; ``compile_fn``, e.g. ``torch.compile``, compiles it once,
    every read having the same shapes).
    """

    name = "inference"
    traceable = True

    def __init__(self, compile_fn: Optional[Callable[[Callable], Callable]] = None, kernel: Optional[bool] = None):
        self._compile_fn = compile_fn
        self._append, self._read = _append_impl, _read_impl
        if compile_fn is not None:
            self._append, self._read = compile_fn(_append_impl), compile_fn(_read_impl)
        self.kernel = kernel
        self._slots: dict[torch.device, list[Tensor]] = {}

    def resolve(self, device: torch.device) -> "InferenceRouter":
        """Fix ``kernel`` for ``device`` (None: the kernel where it runs, i.e. CUDA with Triton)."""
        if self.kernel is None:
            from mhar.model.routing.decode import available

            self.kernel = available(device) and device.type == "cuda"
        return self

    def _slot(self, n: int, device: torch.device) -> Tensor:
        """A 0-dim long tensor holding n (one per value: a graph input, never a specialised constant)."""
        slots = self._slots.setdefault(device, [])
        while len(slots) <= n:
            slots.append(torch.tensor(len(slots), dtype=torch.long, device=device))
        return slots[n]

    def _flush(self, state: _Sources) -> None:
        if state.pending is not None:
            self._append(state.buf, state.ms, state.pending, self._slot(state.n, state.buf.device))
            state.n, state.pending = state.n + 1, None

    def init(self, first: Tensor, capacity: int) -> _Sources:
        if first.dim() != 3:
            raise ValueError("InferenceRouter.init: the first source must be (B, T, D) (expand a (D,) null source)")
        buf = torch.zeros((capacity, *first.shape), dtype=first.dtype, device=first.device)
        ms = torch.zeros((capacity, *first.shape[:2], 1), dtype=torch.float32, device=first.device)
        return _Sources(buf, ms, 0, first)

    def append(self, state: _Sources, src: Tensor) -> _Sources:
        self._flush(state)  # two appends without a read between them: write the older one now
        if state.n >= state.buf.shape[0]:
            raise ValueError(f"InferenceRouter: capacity {state.buf.shape[0]} sources exceeded")
        return _Sources(state.buf, state.ms, state.n, src)

    def num_sources(self, state: _Sources) -> int:
        return state.n + (state.pending is not None)

    def read(self, state: _Sources, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6, *,
             extra: Optional[Tensor] = None, return_weights: bool = False, lookahead=None):
        if self.kernel and not return_weights:
            from mhar.model.routing.decode import decode_read

            out = decode_read(state.buf, state.ms.view(state.ms.shape[:-1]), state.n, query, norm_weight,
                              int(num_heads), float(eps), pending=state.pending, extra=extra)
            if state.pending is not None:
                state.n, state.pending = state.n + 1, None
            return out
        out, w = self._read(state.buf, state.ms, self._slot(state.n, state.buf.device), query, norm_weight,
                            int(num_heads), float(eps), extra, state.pending)
        if state.pending is not None:
            state.n, state.pending = state.n + 1, None
        if return_weights:
            cap = state.buf.shape[0]
            keep = list(range(state.n)) + ([cap] if extra is not None else [])
            return out, w[keep].permute(1, 2, 3, 0).contiguous()  # (B, T, H, N)
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


def _compile_mode(value: Any, device: torch.device) -> str:
    """``compile`` setting -> "none" | "regional" | "whole" (``auto`` / true: regional on CUDA / always)."""
    if isinstance(value, str) and value.strip().lower() in ("regional", "whole", "none"):
        return value.strip().lower()
    on = _auto(value, device.type == "cuda", "compile")
    return "regional" if on else "none"


_SUBLAYERS = ("attn_sublayer", "mlp_sublayer")
_MISSING = object()


class _Regional:
    """Regional compilation: each sublayer kind (``Block.attn_sublayer`` ...) and the final norm compiled once,
    one graph shared by every layer (the parameters are graph inputs), applied to a model's blocks only while
    ``applied(model)`` is open (the model is not changed for other callers). Compiles in seconds where the
    whole unrolled model takes minutes; the residual's reads / writes between them run as they are (the
    decoder's InferenceRouter compiles its own append and read)."""

    def __init__(self, compile_fn: Callable[[Callable], Callable]):
        from mhar.model.transformer import Block, RMSNorm

        self.fns = {name: compile_fn(getattr(Block, name)) for name in _SUBLAYERS}
        self.norm = compile_fn(RMSNorm.forward)

    @contextlib.contextmanager
    def applied(self, model):
        saved = []
        targets = [(blk, name, fn) for blk in model.layers for name, fn in self.fns.items()]
        targets.append((model.final_norm, "forward", self.norm))
        for mod, name, fn in targets:
            saved.append((mod, name, mod.__dict__.get(name, _MISSING)))
            mod.__dict__[name] = _bind(fn, mod)
        try:
            yield
        finally:
            for mod, name, old in reversed(saved):
                if old is _MISSING:
                    mod.__dict__.pop(name, None)
                else:
                    mod.__dict__[name] = old


def _bind(fn: Callable, mod) -> Callable:
    def bound(*args, **kwargs):
        return fn(mod, *args, **kwargs)
    return bound


class Decoder:
    """Greedy decoding of a ``mhar.model.transformer.Transformer`` (see the module docstring).

    ``compile``: how the decode step is compiled: ``regional`` (each sublayer kind, the router's append and
    read, the head: a few small graphs shared by all layers), ``whole`` (the whole step as one graph: more
    fusion, a much longer first compile), ``none``; ``auto`` / true = regional on CUDA, none on CPU.
    ``cuda_graphs``: capture the step (``auto``: on CUDA); ``backend``: the ``torch.compile`` backend
    (``inductor``; CPU tests use ``aot_eager``); ``kernel``: the routed reads by the Triton decode kernel
    (``None``: on CUDA; see ``InferenceRouter``)."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor",
                 kernel: Optional[bool] = None):
        self.model = model
        self.compile_opt, self.graphs_opt, self.backend, self.kernel = compile, cuda_graphs, backend, kernel
        self._router: Optional[InferenceRouter] = None
        self._compiled: Optional[Callable] = None
        self._regional: Optional[_Regional] = None
        self._head: Optional[Callable] = None
        self._caches: dict[int, KVCache] = {}  # batch bucket -> pooled static cache (CUDA graphs)
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self.captures = 0  # CUDA graphs captured so far (tests, logs)

    # settings resolved for the model's device
    def _device(self) -> torch.device:
        return self.model.embed.weight.device

    def mode(self) -> str:
        return _compile_mode(self.compile_opt, self._device())

    def compiled(self) -> bool:
        return self.mode() != "none"

    def graphs(self) -> bool:
        """Whether decode steps run as captured graphs (``emulate``: the same bookkeeping on any device, each
        replay an eager call of the step; for tests of the graph path on CPU)."""
        return _graphs_wanted(self.graphs_opt, self._device())

    def clear(self) -> None:
        """Free the pooled caches and CUDA graphs."""
        self._caches.clear()
        self._graphs.clear()

    def _compile_fn(self, fn: Callable) -> Callable:
        return _compile(fn, self.backend)

    @property
    def router(self) -> InferenceRouter:
        if self._router is None:
            self._router = InferenceRouter(self._compile_fn if self.mode() == "regional" else None,
                                           kernel=self.kernel).resolve(self._device())
        return self._router

    # the step: one token per row through the whole model, depth routing by InferenceRouter
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
                    self._compiled = _compile(self._step, self.backend, fullgraph=True)
                return self._compiled(ids, cache)
            if self._regional is None:
                self._regional = _Regional(self._compile_fn)
            with self._regional.applied(self.model):
                return self._step(ids, cache)

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


def score_length_bucket(T: int) -> int:
    """The padded length of a scored batch: a multiple of 64 up to 512, of 128 up to 1024, of 256 beyond (few
    shapes to capture, at most 25% padding for short inputs and 12.5% at the longest)."""
    for limit, step in ((512, 64), (1024, 128)):
        if T <= limit:
            return max(step, _round_up(T, step))
    return _round_up(T, 256)


class _ScoreGraph:
    """The captured forward of one (batch bucket, length bucket): static ids in, static hidden states out."""

    def __init__(self, scorer: "Scorer", ids: Tensor):
        self.scorer, self.ids = scorer, ids
        self.graph: Any = None
        self.out: Optional[Tensor] = None

    def replay(self) -> None:
        if self.graph is None:  # emulation off CUDA: the same bookkeeping, an eager forward per replay
            self.out = self.scorer._forward(self.ids)
        else:
            self.graph.replay()


class Scorer:
    """Hidden states and target log-probabilities for log-likelihood scoring (see the module docstring).

    ``compile``: ``regional`` (each sublayer kind and the final norm compiled once, shared by all layers; the
    routing runs the model's own router between them), ``whole`` (``Transformer.hidden`` as one graph, fullgraph:
    the fused router, whose Python glue dynamo cannot trace, is replaced for the call by ``InferenceRouter`` with
    the custom op ``mhar::decode_read``: same function, inference only), ``none``; ``auto`` / true = regional on
    CUDA, none on CPU.
    ``cuda_graphs``: replay each (batch bucket, length bucket)'s forward as a CUDA graph (``auto``: on CUDA):
    no host work per sublayer or routing call, so short inputs run at the GPU's speed; the graphs share one
    memory pool (they run one at a time; each call's states are copied out). ``backend``: the
    ``torch.compile`` backend."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor"):
        self.model = model
        self.compile_opt, self.graphs_opt, self.backend = compile, cuda_graphs, backend
        self._hidden_c: Optional[Callable] = None
        self._regional: Optional[_Regional] = None
        self._head_c: Optional[Callable] = None
        self._graphs: dict[tuple[int, int], _ScoreGraph] = {}
        self._pool: Any = None
        self.captures = 0

    def _device(self) -> torch.device:
        return self.model.embed.weight.device

    def mode(self) -> str:
        return _compile_mode(self.compile_opt, self._device())

    def _whole_router(self) -> Optional[InferenceRouter]:
        """``whole`` mode: a router dynamo traces in place of one it cannot (the fused kernels' Python state
        machine): InferenceRouter with the custom op ``mhar::decode_read`` where Triton runs, else its PyTorch
        expression. None when the model's own routing traces."""
        if traceable_router(self.model):
            return None
        if getattr(self, "_wrouter", None) is None:
            from mhar.model.routing.decode import available

            self._wrouter = InferenceRouter(kernel=available(self._device()))
        return self._wrouter

    def compiled(self) -> bool:
        return self.mode() != "none"

    def graphs(self) -> bool:
        """Whether forwards replay CUDA graphs (``emulate``: the bucket bookkeeping on any device, for tests)."""
        return _graphs_wanted(self.graphs_opt, self._device())

    def clear(self) -> None:
        """Free the captured graphs and their memory pool."""
        self._graphs.clear()
        self._pool = None

    def _compile_fn(self, fn: Callable) -> Callable:
        return _compile(fn, self.backend)

    def _forward(self, ids: Tensor) -> Tensor:
        """``Transformer.hidden`` of padded ids as the compile mode says."""
        mode = self.mode()
        if mode == "regional":
            if self._regional is None:
                self._regional = _Regional(self._compile_fn)
            with self._regional.applied(self.model):
                return self.model.hidden(ids)
        if mode == "whole":
            if self._hidden_c is None:
                self._hidden_c = _compile(self.model.hidden, self.backend, fullgraph=True)
            torch._dynamo.mark_dynamic(ids, 1)
            with use_router(self.model, self._whole_router()):
                return self._hidden_c(ids)
        return self.model.hidden(ids)

    def _capture(self, Bp: int, Tp: int) -> _ScoreGraph:
        g = self._graphs.get((Bp, Tp))
        if g is not None:
            return g
        dev = self._device()
        g = _ScoreGraph(self, torch.zeros(Bp, Tp, dtype=torch.long, device=dev))
        if dev.type == "cuda":
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up: compilation, autotuning, allocator
                self._forward(g.ids)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool):
                    g.out = self._forward(g.ids)
            except RuntimeError as e:  # a router that cannot be captured (a host sync): score without graphs
                warnings.warn(f"mhar.model.inference.Scorer: the forward could not be captured as a CUDA graph ({e}); "
                              "scoring without CUDA graphs")
                torch.cuda.synchronize(dev)
                self.graphs_opt = False
                g.out = None
                return g
            g.graph = graph
            self._pool = graph.pool()
            self.captures += 1
        self._graphs[(Bp, Tp)] = g
        return g

    def hidden(self, ids: Tensor) -> Tensor:
        """Final-normed states (B, T, D) of right-padded ids (B, T) (the padding only follows the read ones)."""
        graphs = self.graphs()
        if self.mode() == "none" and not graphs:
            return self.model.hidden(ids)
        B, T = ids.shape
        Bp, Tp = batch_bucket(B), score_length_bucket(T)
        if (Bp, Tp) != (B, T):
            padded = ids.new_zeros(Bp, Tp)
            padded[:B, :T] = ids
            ids = padded
        if not graphs:
            return self._forward(ids)[:B, :T]
        g = self._capture(Bp, Tp)
        if not self.graphs():  # the capture failed
            return self._forward(ids)[:B, :T]
        g.ids.copy_(ids)
        g.replay()
        return g.out[:B, :T].clone()  # the pool's memory is the next replay's

    def token_logprobs(self, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(log-probabilities fp32 (N,), greedy flags (N,)) of ``targets`` (N,) after states ``h`` (N, D)."""
        fn = lambda x, t: _head_logprobs(self.model, x, t)  # noqa: E731
        if self.compiled():
            if self._head_c is None:
                self._head_c = self._compile_fn(_head_logprobs)
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
                                      "backend": dec.backend, "kernel": dec.kernel}
        dec = Decoder(model, **{**old, **settings})
        object.__setattr__(model, "_mhar_decoder", dec)
    return dec


def scorer_for(model, **settings) -> Scorer:
    """The model's scorer (created on first use; ``settings`` replace the current ones)."""
    sc = getattr(model, "_mhar_scorer", None)
    if sc is None or settings:
        old = {} if sc is None else {"compile": sc.compile_opt, "cuda_graphs": sc.graphs_opt, "backend": sc.backend}
        sc = Scorer(model, **{**old, **settings})
        object.__setattr__(model, "_mhar_scorer", sc)
    return sc
