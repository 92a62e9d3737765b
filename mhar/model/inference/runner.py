"""What the scorer and the decoder share: their settings (compile mode, CUDA graphs, backend), the regional
compilation of a model's sublayers, swapping the model's router for a call, and the batch buckets."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch

from mhar.model.compile import compile_fn
from mhar.model.routing import Router

CACHE_MULTIPLE = 128  # decode cache capacity granularity (one CUDA graph per batch bucket and capacity)


def batch_bucket(n: int) -> int:
    """The power of two >= n (batch sizes that share one compiled graph / CUDA graph)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def round_up(x: int, m: int) -> int:
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


def graphs_wanted(opt: Any, device: torch.device) -> bool:
    """The ``cuda_graphs`` option on ``device`` (``emulate``: the graph bookkeeping on any device, for tests)."""
    if opt == "emulate":
        return True
    want = _auto(opt, device.type == "cuda", "cuda_graphs")
    if want and device.type != "cuda":
        raise ValueError("cuda_graphs=true needs the model on a CUDA device")
    return want


def compile_mode(value: Any, device: torch.device) -> str:
    """``compile`` setting -> "none" | "regional" | "whole" (``auto`` / true: regional on CUDA / always)."""
    if isinstance(value, str) and value.strip().lower() in ("regional", "whole", "none"):
        return value.strip().lower()
    on = _auto(value, device.type == "cuda", "compile")
    return "regional" if on else "none"


@contextlib.contextmanager
def use_router(model, router: Optional[Router]) -> Iterator[None]:
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


_SUBLAYERS = ("attn_sublayer", "mlp_sublayer")
_MISSING = object()


def _bind(fn: Callable, mod) -> Callable:
    def bound(*args, **kwargs):
        return fn(mod, *args, **kwargs)
    return bound


class Regional:
    """Regional compilation: each sublayer kind (``Block.attn_sublayer`` ...) and the final norm compiled once,
    one graph shared by every layer (the parameters are graph inputs), applied to a model's blocks only while
    ``applied(model)`` is open (the model is not changed for other callers). Compiles in seconds where the
    whole unrolled model takes minutes; the residual's reads / writes between them run as they are (the
    decoder's DecodeRouter compiles its own append and read)."""

    def __init__(self, compile_fn: Callable[[Callable], Callable]):
        self.compile_fn = compile_fn
        self.fns: Optional[dict[str, Callable]] = None
        self.norm: Optional[Callable] = None

    @contextlib.contextmanager
    def applied(self, model) -> Iterator[None]:
        if self.fns is None:  # the model's own block and norm classes
            block = type(model.layers[0])
            self.fns = {name: self.compile_fn(getattr(block, name)) for name in _SUBLAYERS}
            self.norm = self.compile_fn(type(model.final_norm).forward)
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


class Runner:
    """The settings and compile helpers of an inference path over one model (``Scorer``, ``Decoder``).

    ``compile``: ``regional`` (each sublayer kind and the final norm compiled once, shared by all layers),
    ``whole`` (the path's whole forward as one graph), ``none``; ``auto`` / true = regional on CUDA, none on CPU.
    ``cuda_graphs``: replay captured graphs (``auto``: on CUDA; ``emulate``: the graph bookkeeping on any device,
    each replay an eager call, for tests). ``backend``: the ``torch.compile`` backend (``inductor``; CPU tests use
    ``aot_eager``)."""

    def __init__(self, model, compile: Any = "auto", cuda_graphs: Any = "auto", backend: str = "inductor"):
        self.model = model
        self.compile_opt, self.graphs_opt, self.backend = compile, cuda_graphs, backend
        self._regional: Optional[Regional] = None
        self._graphs: dict[tuple[int, int], Any] = {}
        self.captures = 0  # CUDA graphs captured so far (tests, logs)

    def settings(self) -> dict[str, Any]:
        """The constructor's keyword arguments as set now (``runner_for`` keeps them when others change)."""
        return {"compile": self.compile_opt, "cuda_graphs": self.graphs_opt, "backend": self.backend}

    def _device(self) -> torch.device:
        return self.model.embed.weight.device

    def mode(self) -> str:
        return compile_mode(self.compile_opt, self._device())

    def compiled(self) -> bool:
        return self.mode() != "none"

    def graphs(self) -> bool:
        """Whether calls replay captured graphs (see the class docstring)."""
        return graphs_wanted(self.graphs_opt, self._device())

    def clear(self) -> None:
        """Free the captured graphs."""
        self._graphs.clear()

    def _compile_fn(self, fn: Callable, **kwargs: Any) -> Callable:
        return compile_fn(fn, self.backend, inference=True, **kwargs)

    def regional(self, model) -> contextlib.AbstractContextManager:
        """``Regional`` compilation applied to ``model`` for the duration of the block."""
        if self._regional is None:
            self._regional = Regional(self._compile_fn)
        return self._regional.applied(model)


def runner_for(model, attr: str, cls: type, settings: dict[str, Any]) -> Any:
    """The model's runner of class ``cls``, kept in attribute ``attr`` (created on first use; ``settings`` replace
    the current ones, a new runner then)."""
    run = getattr(model, attr, None)
    if run is None or settings:
        run = cls(model, **{**({} if run is None else run.settings()), **settings})
        object.__setattr__(model, attr, run)
    return run


__all__ = ["Runner", "Regional", "runner_for", "use_router", "batch_bucket", "round_up", "compile_mode",
           "graphs_wanted", "CACHE_MULTIPLE"]
