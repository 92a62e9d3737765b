"""Log-likelihood scoring at training speed (``Scorer``): the requests lm-eval sends.

Hidden states of right-padded batches through a ``torch.compile``'d ``Transformer.hidden`` (on CUDA by default;
the sequence length is padded to a bucket (``score_length_bucket``) and marked dynamic, the batch padded to a
power of two, so a run compiles once per batch bucket and not per batch), then the output head only on the
scored positions, in chunks, with the log-softmax, the target's log-probability and the greedy check fused
into one pass over the logits (the (positions, vocabulary) fp32 block of the eager path is never written).
Under ``no_grad`` nothing is saved for a backward pass.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from mhar.model.inference.runner import Runner, batch_bucket, round_up, runner_for, use_router
from mhar.model.routing import DecodeRouter, routing_traceable
from mhar.model.routing.decode import available as decode_kernel_available

HEAD_CHUNK = 1024  # scored positions per output-head call: bounds the (positions, vocabulary) logits block


def logit_logprobs(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(log p(target) fp32 (N,), target is the argmax (N,)) from logits (N, V): the one scoring formula."""
    lp = F.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), lp.argmax(-1) == targets


def _head_logprobs(model, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`logit_logprobs` from states h (N, D) through the output head; compiled, one pass over the
    logits (the fp32 log-softmax is fused into the gather and the argmax)."""
    return logit_logprobs(model.lm_head(h), targets)


def chunked_logprobs(fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], h: Tensor, targets: Tensor,
                     dynamic: bool = False) -> tuple[Tensor, Tensor]:
    """``fn`` (states or logits (n, .), targets (n,)) -> (log-probabilities, greedy flags) over ``HEAD_CHUNK``
    positions at a time, concatenated; ``dynamic``: mark each chunk's length dynamic (a compiled ``fn``)."""
    lps, greedy = [], []
    for s in range(0, h.shape[0], HEAD_CHUNK):
        x, t = h[s: s + HEAD_CHUNK], targets[s: s + HEAD_CHUNK]
        if dynamic and x.shape[0] > 1:
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(t, 0)
        lp, g = fn(x, t)
        lps.append(lp)
        greedy.append(g)
    return torch.cat(lps), torch.cat(greedy)


def score_length_bucket(T: int) -> int:
    """The padded length of a scored batch: a multiple of 64 up to 512, of 128 up to 1024, of 256 beyond (few
    shapes to capture, at most 25% padding for short inputs and 12.5% at the longest)."""
    for limit, step in ((512, 64), (1024, 128)):
        if T <= limit:
            return max(step, round_up(T, step))
    return round_up(T, 256)


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


class Scorer(Runner):
    """Hidden states and target log-probabilities for log-likelihood scoring (see the module docstring).

    ``compile`` (``Runner``): ``regional`` runs the model's own router between the compiled sublayers; ``whole``
    compiles ``Transformer.hidden`` as one graph (fullgraph): a router dynamo cannot trace (the fused one's Python
    glue) is replaced for the call by ``DecodeRouter`` with the custom op ``mhar::decode_read`` (same function,
    inference only). ``cuda_graphs``: replay each (batch bucket, length bucket)'s forward as a CUDA graph: no
    host work per sublayer or routing call, so short inputs run at the GPU's speed; the graphs share one memory
    pool (they run one at a time; each call's states are copied out)."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor"):
        super().__init__(model, compile, cuda_graphs, backend)
        self._hidden_c: Optional[Callable] = None
        self._head_c: Optional[Callable] = None
        self._whole: Optional[DecodeRouter] = None
        self._pool: Any = None

    def _whole_router(self) -> Optional[DecodeRouter]:
        """``whole`` mode: a router dynamo traces in place of one it cannot (the fused kernels' Python state
        machine): DecodeRouter with the custom op ``mhar::decode_read`` where Triton runs, else its PyTorch
        expression. None when the model's own routing traces."""
        if routing_traceable(self.model, self._device()):
            return None
        if self._whole is None:
            self._whole = DecodeRouter(kernel=decode_kernel_available(self._device()))
        return self._whole

    def clear(self) -> None:
        """Free the captured graphs and their memory pool."""
        super().clear()
        self._pool = None

    def _forward(self, ids: Tensor) -> Tensor:
        """``Transformer.hidden`` of padded ids as the compile mode says."""
        mode = self.mode()
        if mode == "regional":
            with self.regional(self.model):
                return self.model.hidden(ids)
        if mode == "whole":
            if self._hidden_c is None:
                self._hidden_c = self._compile_fn(self.model.hidden, fullgraph=True)
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
        return chunked_logprobs(fn, h, targets, dynamic=self.compiled())

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


def scorer_for(model, **settings) -> Scorer:
    """The model's scorer (created on first use; ``settings`` replace the current ones)."""
    return runner_for(model, "_mhar_scorer", Scorer, settings)


__all__ = ["Scorer", "scorer_for", "score_length_bucket", "HEAD_CHUNK", "chunked_logprobs", "logit_logprobs"]
