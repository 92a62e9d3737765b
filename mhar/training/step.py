"""The one training step: what ``python -m mhar.train`` runs and what ``benchmarks/bench_training.py`` times.

One optimizer update = forward + backward of every micro-batch (gradient accumulation), global-norm
clipping, AdamW. How it runs is decided once by :func:`plan_step` from the run config and the device:

* **compile** (``train.compile``: ``auto`` = on CUDA, off on CPU; ``true``/``false`` force it):
  ``torch.compile`` of each block's two sublayer methods (``attn_sublayer``, ``mlp_sublayer``: two graphs
  shared by all layers) when the residual variant calls a kernel that dynamo cannot trace (the fused Triton
  routing), otherwise of the whole decoder (``Transformer.hidden``); plus the LM head + loss
  (``Transformer.head_loss``) as its own graph, so the fp32 logits never materialise in eager mode. These
  are the compiled pieces the benchmark found fastest (docs/PERFORMANCE.md).
* **CUDA graph** (``train.cuda_graph``: ``auto`` = on for single-process CUDA runs with compile on; off under
  DDP/FSDP, whose communication hooks are not captured here): after ``GRAPH_WARMUP`` ordinary steps (which
  compile, autotune and create the optimizer state), the whole update (every micro-batch's forward and
  backward, clipping, fused AdamW) is captured once with static input buffers and replayed for every later
  step. The same kernels run in the same order on the same buffers, so a replayed step equals an eager
  step (tests/training/test_step.py checks it on a GPU). The learning rate lives in a device tensor that is set before
  each replay; a non-finite loss or gradient norm skips the update inside the graph (fused AdamW's
  ``found_inf``), so the NaN guard keeps its guarantee: the weights and optimizer state are untouched.
* **precision**: bf16 autocast on CUDA (``train.dtype: auto|bf16``), fp32 master weights; TF32 matmuls for
  the few fp32 products; fused AdamW on CUDA; SDPA picks the flash kernel for bf16 causal attention.

CPU runs take the eager path (no compile, no graph). The step returns the mean loss and the gradient norm as
Python floats (one device sync per step).

FLOPs (cumulative, training only; PaLM appendix B convention, no causal-mask discount):
``flops/token = 6 * N + 12 * n_layers * n_heads * head_dim * seq_len`` where ``N`` counts every
matmul parameter: all parameters except the input embedding table, plus the output projection
``d_model * vocab`` when it is tied to the embedding. Routing, norms and elementwise ops are left out.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from mhar.model.compile import compile_fn
from mhar.model.config import ConfigError
from mhar.model.routing import routing_traceable

__all__ = ["StepPlan", "StepResult", "TrainStep", "plan_step", "build_optimizer", "autocast_for", "peak_flops",
           "micro_forward", "Throughput", "GRAPH_WARMUP"]

GRAPH_WARMUP = 3  # eager steps before the CUDA graph is captured (compile, autotune, optimizer state)

# bf16 dense peak of one GPU (FLOP/s), for model FLOPs utilisation; vendor spec sheets (SXM parts).
_PEAK_BF16 = (("H200", 989.4e12), ("H100", 989.4e12), ("GH200", 989.4e12), ("B200", 2250e12),
              ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))


def peak_flops(device: torch.device) -> Optional[float]:
    """bf16 dense peak FLOP/s of ``device`` if it is a GPU we know, else None (MFU is then not reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for key, v in _PEAK_BF16 if key in name), None)


def autocast_for(device: torch.device, dtype: str):
    """bf16 autocast on request (``bf16``) or by default on CUDA (``auto``); fp32 otherwise."""
    use_bf16 = dtype == "bf16" or (dtype == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def micro_forward(model: nn.Module, x: Tensor, y: Tensor, autocast: Any, z_weight: float = 0.0
                  ) -> tuple[Tensor, Tensor]:
    """(mean next-token loss, objective = loss + z_weight * z-loss) of one micro-batch, fp32 scalars."""
    with autocast:
        out = model(x, labels=y, z_weight=z_weight)
    return out.loss, out.objective


@dataclass(frozen=True)
class StepPlan:
    compile: str  # "none" | "decoder" | "sublayers"
    cuda_graph: bool
    fused_adamw: bool
    why: str  # one line for the log

    def describe(self) -> str:
        return f"compile={self.compile} cuda_graph={self.cuda_graph} fused_adamw={self.fused_adamw} ({self.why})"


def _flag(value: Any, key: str) -> Optional[bool]:
    """'auto' -> None; bools pass."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected auto, true or false, got {value!r}")


def plan_step(raw: nn.Module, device: torch.device, *, compile: Any = "auto", cuda_graph: Any = "auto",
              world_size: int = 1, parallel: str = "ddp") -> StepPlan:
    """Decide how the step runs (see the module docstring)."""
    want_compile = _flag(compile, "train.compile")
    want_graph = _flag(cuda_graph, "train.cuda_graph")
    cuda = device.type == "cuda"
    do_compile = cuda and not (world_size > 1 and parallel == "fsdp") if want_compile is None else want_compile
    kind = "none"
    if do_compile:
        kind = "decoder" if routing_traceable(raw, device) else "sublayers"
    single = world_size == 1
    if want_graph is None:
        graph = cuda and single and do_compile
    else:
        graph = want_graph
        if graph and not single:
            raise ConfigError("train.cuda_graph: true is not supported under DDP/FSDP (torchrun); use auto or false")
        if graph and not cuda:
            raise ConfigError("train.cuda_graph: true needs train.device cuda")
    why = ("CUDA, one process" if single else f"CUDA, {world_size} processes ({parallel})") if cuda else "CPU"
    return StepPlan(kind, graph, cuda, why)


def build_optimizer(model: nn.Module, groups: list[dict], lr: float, betas: tuple[float, float], eps: float,
                    plan: StepPlan, device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``groups`` (see ``param_groups``); fused on CUDA, capturable (tensor LR) for a CUDA graph."""
    kwargs: dict = dict(betas=betas, eps=eps)
    if plan.fused_adamw:
        kwargs["fused"] = True
    if plan.cuda_graph:
        kwargs["capturable"] = True
        lr = torch.tensor(float(lr), dtype=torch.float32, device=device)
    return torch.optim.AdamW(groups, lr=lr, **kwargs)


def _compile_model(raw: nn.Module, kind: str) -> None:
    """Replace the methods that the step calls by their compiled versions (in place, on the raw model)."""
    if kind == "sublayers":
        # The token embedding too (its forward; autograd then runs the compiled backward): inductor lowers the
        # lookup's gradient to a fill and a scatter of atomic adds, as in the baseline's compiled decoder (eager
        # autograd's sort-based embedding backward is several times slower). The order of those adds, so the last
        # bits of the embedding's gradient, then varies from run to run, as it does for the baseline.
        raw.embed.forward = compile_fn(raw.embed.forward)
        for blk in raw.layers:
            blk.attn_sublayer = compile_fn(blk.attn_sublayer)
            blk.mlp_sublayer = compile_fn(blk.mlp_sublayer)
    elif kind == "decoder":
        raw.hidden = compile_fn(raw.hidden)
    raw.head_loss = compile_fn(raw.head_loss)


@dataclass
class StepResult:
    loss: float
    grad_norm: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class TrainStep:
    """``step(batches, lr) -> StepResult``: one optimizer update on ``batches`` (this rank's micro-batches).

    ``model`` is what forward calls go through (the DDP/FSDP wrapper if any), ``raw`` the Transformer inside.
    A non-finite result leaves weights and optimizer state as they were (the caller stops the run).
    """

    def __init__(self, model: nn.Module, raw: nn.Module, opt: torch.optim.Optimizer, plan: StepPlan, *,
                 device: torch.device, dtype: str = "auto", grad_clip: float = 1.0, z_weight: float = 0.0,
                 grad_sync=None, reduce_mean=None):
        self.model, self.raw, self.opt, self.plan = model, raw, opt, plan
        self.device, self.grad_clip, self.z_weight = device, float(grad_clip), float(z_weight)
        self.autocast = autocast_for(device, dtype)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # grad_sync(i, n) -> context that skips DDP's all-reduce on all but the last micro-batch
        self.grad_sync = grad_sync or (lambda i, n: nullcontext())
        self.reduce_mean = reduce_mean or (lambda t: t)
        self.steps_run = 0
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if plan.compile != "none":
            _compile_model(raw, plan.compile)
        if plan.cuda_graph:
            self._lr = torch.zeros((), dtype=torch.float32, device=device)
            self._found_inf = torch.zeros((), dtype=torch.float32, device=device)
            for g in opt.param_groups:  # a resumed optimizer state may hold a CPU float LR / CPU step counts
                g["lr"], g["capturable"] = self._lr, True
            for st in opt.state.values():
                if "step" in st and st["step"].device != device:
                    st["step"] = st["step"].to(device=device, dtype=torch.float32)

    # -- the math of one update (eager, or recorded into the graph) --------------------------------------
    def _forward_backward(self, pairs: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        n = len(pairs)
        loss_sum = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(pairs):
            with self.grad_sync(i, n):
                loss, objective = micro_forward(self.model, x, y, self.autocast, self.z_weight)
                (objective / n).backward()
            loss_sum = loss_sum + loss.detach().float()
        return loss_sum / n

    def _clip(self) -> Tensor:
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def _graph_body(self) -> tuple[Tensor, Tensor]:
        loss = self._forward_backward(list(zip(self._x, self._y)))
        norm = self._clip()
        self._found_inf.copy_((~(torch.isfinite(loss) & torch.isfinite(norm))).float())
        self.opt.step()
        return loss, norm

    # -- public -----------------------------------------------------------------------------------------
    def __call__(self, batches: Sequence[tuple[Tensor, Tensor]], lr: float) -> StepResult:
        self.steps_run += 1
        if self.plan.cuda_graph and self.steps_run > GRAPH_WARMUP:
            return self._replay(batches, lr)
        for g in self.opt.param_groups:
            if isinstance(g["lr"], Tensor):
                g["lr"].fill_(lr)
            else:
                g["lr"] = lr
        stream = nullcontext()
        if self.plan.cuda_graph:  # warm-up steps run on a side stream (PyTorch's capture recipe)
            self._side = getattr(self, "_side", None) or torch.cuda.Stream(self.device)
            self._side.wait_stream(torch.cuda.current_stream(self.device))
            stream = torch.cuda.stream(self._side)
        with stream:
            pairs = [(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)) for x, y in batches]
            loss = self.reduce_mean(self._forward_backward(pairs))
            norm = self._clip()
            vals = torch.stack([loss.float(), norm.float()]).tolist()
            res = StepResult(vals[0], vals[1])
            if res.finite:
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.plan.cuda_graph:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
        return res

    def _replay(self, batches, lr: float) -> StepResult:
        if self._graph is None:
            self._x = torch.stack([x for x, _ in batches]).to(self.device)
            self._y = torch.stack([y for _, y in batches]).to(self.device)
        else:
            for i, (x, y) in enumerate(batches):
                self._x[i].copy_(x, non_blocking=True)
                self._y[i].copy_(y, non_blocking=True)
        self._lr.fill_(lr)
        if self._graph is None:
            torch.cuda.synchronize(self.device)
            self.opt.found_inf = self._found_inf
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._out = self._graph_body()
        self._graph.replay()
        vals = torch.stack([self._out[0].float(), self._out[1].float()]).tolist()
        return StepResult(vals[0], vals[1])


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token of a ``Transformer`` (see the module docstring for the formula)."""
    c = model.cfg
    n = model.num_params(exclude_embedding=True)
    if c.tie_embeddings:
        n += c.d_model * c.vocab_size
    return 6.0 * n + 12.0 * c.n_layers * c.n_heads * c.resolved_head_dim * seq_len


class Throughput:
    """Speed records of a training segment: per step ``step_ms``, ``tok_s`` and ``mfu`` (model FLOPs
    utilisation = training FLOPs per second / (bf16 peak x GPUs); absent when the peak is unknown), and a
    steady-state summary: medians over the steps after the first ``skip`` (compilation, autotuning, capture).

    Step time is wall time from fetching the batch to having the loss on the host (every step syncs), so it
    includes data loading and excludes evaluation and checkpoint writes."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak: Optional[float], world_size: int = 1,
                 skip: int = GRAPH_WARMUP + 1, window: int = 20):
        self.tokens, self.fpt, self.world = tokens_per_step, flops_per_token, world_size
        self.peak, self.skip, self.window = peak, skip, window
        self.times: list[float] = []

    def _mfu(self, tok_s: float) -> Optional[float]:
        return None if not self.peak else self.fpt * tok_s / (self.peak * self.world)

    def add(self, step_s: float) -> dict:
        self.times.append(step_s)
        tok_s = self.tokens / max(step_s, 1e-12)
        row = {"step_ms": round(1e3 * step_s, 3), "tok_s": round(tok_s, 1)}
        if self.peak:
            row["mfu"] = round(self._mfu(tok_s), 4)
        return row

    def recent_tokens_per_s(self) -> float:
        recent = self.times[-self.window:]
        return self.tokens * len(recent) / max(sum(recent), 1e-12)

    def summary(self, plan: Optional[StepPlan] = None) -> dict:
        steady = self.times[self.skip:] or self.times
        out: dict = {"steady_steps": len(steady), "step_plan": plan.describe() if plan else None}
        if steady:
            med = float(sorted(steady)[len(steady) // 2])
            out.update(step_ms=round(1e3 * med, 3), steady_tokens_per_s=round(self.tokens / med, 1))
            if self.peak:
                out["mfu"] = round(self._mfu(self.tokens / med), 4)
        return out
