"""The routing implementations a user picks (``routing_impl``): the registry, ``auto`` (fused on CUDA with Triton,
eager elsewhere), the kernel settings, old checkpoints' names, and what a run records. The fused kernels' math is
tested in test_fused_routing.py (the Triton interpreter runs them on the CPU: conftest.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import mhar.model.routing.routers as R
from mhar.model.config import ROUTING_IMPLS, model_config
from mhar.model.transformer import build_model
from mhar.model.routing import (AutoRouter, DecodeRouter, EagerRouter, check_kernel_env, get_router, names,
                                resolve_routing_impl, routing_traceable)

ROOT = Path(__file__).resolve().parents[2]
# Where the fused kernels run: the GPU, else the CPU under the Triton interpreter (conftest.py), where ``auto``
# itself picks eager (so the tests make it pick fused there with a mocked device check).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_auto_is_fused_on_cuda_with_triton_and_eager_elsewhere(monkeypatch):
    monkeypatch.setattr(names, "triton_available", lambda: True)
    assert resolve_routing_impl("auto", torch.device("cpu")) == "eager"
    assert resolve_routing_impl("auto", "cpu") == "eager"
    assert resolve_routing_impl("auto", torch.device("cuda", 1)) == "fused"
    assert resolve_routing_impl("auto", "cuda:0") == "fused"
    assert get_router("auto").impl_for(torch.device("cuda")) == "fused"
    monkeypatch.setattr(names, "triton_available", lambda: False)  # no Triton: eager on the GPU too
    assert resolve_routing_impl("auto", torch.device("cuda")) == "eager"
    for impl in ("eager", "compile", "fused"):  # a named implementation is itself on any device
        assert resolve_routing_impl(impl, "cpu") == resolve_routing_impl(impl, "cuda") == impl
    with pytest.raises(ValueError, match="auto, eager, compile, fused"):
        resolve_routing_impl("fused_v7_sg8", "cuda")
    assert set(ROUTING_IMPLS) == {"auto", "eager", "compile", "fused"}


def test_traceable_is_one_router_property(monkeypatch):
    """Whether dynamo traces a model's routing is each router's ``traceable_on(device)``: the reference routers
    and the decode router yes, the fused one no, ``auto`` as the router it picks there; no router: yes."""
    monkeypatch.setattr(names, "triton_available", lambda: True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert get_router("eager").traceable_on(cuda) and get_router("compile").traceable_on(cuda)
    assert DecodeRouter(kernel=False).traceable_on(cpu) and not get_router("fused").traceable_on(cpu)
    auto = get_router("auto")
    assert auto.traceable_on(cpu) and not auto.traceable_on(cuda)
    baseline = build_model(model_config("debug"))
    routed = build_model(model_config("debug", residual={"variant": "mhar", "heads": 4, "routing_impl": "fused"}))
    assert routing_traceable(baseline, cuda) and not routing_traceable(routed, cpu)


def _routed(router, x, qs, gs, H=2):
    """Three reads interleaved with appends (the first announcing the others), as a model makes them."""
    Q, G = torch.stack(qs), torch.stack(gs)
    st = router.init(x, capacity=3)
    outs = []
    for i in range(3):
        outs.append(router.read(st, Q[i], G[i], H, lookahead=(Q[i + 1:], G[i + 1:])))
        if i < 2:
            st = router.append(st, torch.tanh(outs[-1]))
    return torch.stack(outs)


def test_auto_router_routes_each_forward_on_its_device(monkeypatch):
    """``auto`` picks its router at each forward's ``init`` from the first source's device: eager on the CPU;
    where the device resolves to fused (mocked here: the CPU under the Triton interpreter) the fused router runs,
    with the same outputs and gradients."""
    from mhar.model.routing import fused as fused_mod
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, generator=gen, requires_grad=True)
    qs = [(0.5 * torch.randn(16, generator=gen)).requires_grad_() for _ in range(3)]
    gs = [(1 + 0.2 * torch.randn(16, generator=gen)).requires_grad_() for _ in range(3)]

    auto = get_router("auto")
    assert isinstance(auto, AutoRouter) and auto.active is None
    out_e = _routed(auto, x, qs, gs)
    assert isinstance(auto.active, EagerRouter)
    grads_e = torch.autograd.grad(out_e.pow(2).sum(), [x, *qs, *gs])

    if DEV == "cpu":  # (a new router: each router decides once per device type)
        monkeypatch.setattr(R, "resolve_routing_impl", lambda impl, device: "fused")
        auto = get_router("auto")
    leaves = [t.detach().to(DEV).requires_grad_() for t in [x, *qs, *gs]]
    calls = fused_mod._Read.calls
    out_f = _routed(auto, leaves[0], leaves[1:4], leaves[4:])  # a forward on DEV
    assert isinstance(auto.active, fused_mod.FusedRouter) and fused_mod._Read.calls == calls + 3
    grads_f = torch.autograd.grad(out_f.pow(2).sum(), leaves)
    torch.testing.assert_close(out_f.cpu(), out_e, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_f, grads_e):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


def test_models_default_to_auto_and_route_eager_on_the_cpu():
    model = build_model(model_config("debug", residual={"variant": "mhar", "heads": 4}))
    assert model.cfg.residual.routing_impl == "auto" and isinstance(model.residual.router, AutoRouter)
    model(torch.randint(0, 257, (1, 8)))
    assert isinstance(model.residual.router.active, EagerRouter)
    assert R.routing_info(model, torch.device("cpu")) == {"impl": "auto", "resolved": "eager", "pdl": False}
    baseline = build_model(model_config("debug"))
    assert R.routing_info(baseline, torch.device("cpu"))["resolved"] is None  # no routing to run


def test_a_fused_checkpoint_loads_eager_on_the_cpu_and_old_names_load_as_fused(tmp_path):
    """routing_impl is how a model executes: one saved by a fused run (here under a withdrawn kernel variant's name,
    as older checkpoints store it) loads as ``fused``, and evaluates with ``eager`` on a CPU to the same logits."""
    from mhar.runs.checkpoint import load_model, save_model
    from mhar.model.routing.fused import FusedRouter
    torch.manual_seed(0)
    model = build_model(model_config("debug", residual={"variant": "mhar", "heads": 4, "routing_impl": "fused"}))
    with torch.no_grad():
        for p in model.residual.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ids = torch.randint(0, 257, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.to(DEV)(ids.to(DEV)).logits.cpu()  # the fused kernels (on a CPU: the Triton interpreter)
    model.cfg.residual.routing_impl = "fused_v7_sg8"  # what an older run's model.pt says
    save_model(tmp_path / "model.pt", model, "byte")
    loaded, _, _ = load_model(tmp_path / "model.pt")
    assert loaded.cfg.residual.routing_impl == "fused" and isinstance(loaded.residual.router, FusedRouter)
    eager, _, _ = load_model(tmp_path / "model.pt", routing_impl="eager")
    assert isinstance(eager.residual.router, EagerRouter)
    with torch.no_grad():
        torch.testing.assert_close(eager(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_kernel_settings_are_two_and_checked(monkeypatch):
    for var in [v for v in os.environ if v.startswith(names.KERNEL_ENV_PREFIX)]:
        monkeypatch.delenv(var)
    assert set(names.KERNEL_ENV) == {"MHAR_ROUTING_AUTOTUNE", "MHAR_ROUTING_PDL"}
    monkeypatch.setenv("MHAR_ROUTING_PDL", "0")
    monkeypatch.setenv("MHAR_ROUTING_AUTOTUNE", "0")
    check_kernel_env()
    assert names.kernel_env() == {"MHAR_ROUTING_AUTOTUNE": "0", "MHAR_ROUTING_PDL": "0"}
    assert not names.autotune()
    monkeypatch.setenv("MHAR_ROUTING_PDL", "yes")
    with pytest.raises(ValueError, match="MHAR_ROUTING_PDL='yes': set it to one of 0, 1"):
        check_kernel_env()
    monkeypatch.delenv("MHAR_ROUTING_PDL")
    monkeypatch.setenv("MHAR_ROUTING_GROUPS", "4")  # not a setting (e.g. a withdrawn knob): named, not ignored
    with pytest.raises(ValueError, match="MHAR_ROUTING_GROUPS: not a routing kernel setting.*AUTOTUNE"):
        check_kernel_env()


def _train_smoke(tmp_path, out, *extra):
    """``python -m mhar.train config/train/gpu_smoke.yaml model.residual.variant=mhar model.residual.heads=8``
    (no routing_impl) shrunk to a CPU second; returns its provenance.json."""
    import mhar.training.cli as CLI
    args = [str(ROOT / "config" / "train" / "gpu_smoke.yaml"), "model.residual.variant=mhar", "model.residual.heads=8",
            "model.preset=debug", "train.device=cpu", "train.dtype=fp32", "data.corpus=synthetic:20000",
            f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.val_tokens=64", "train.steps=2",
            "train.global_batch=2", "train.micro_batch=2", "train.warmup_steps=1", "train.eval_every=2",
            "train.tail_k=1", "train.log_every=1", "train.threads=1", *extra, "--out", str(tmp_path / out)]
    assert CLI.main(args) == 0
    return json.loads((tmp_path / out / "provenance.json").read_text())


def test_trainer_records_the_routing_it_runs(tmp_path, monkeypatch):
    """The GPU smoke command with no routing_impl records in provenance.json what ``auto`` ran: eager on this CPU;
    fused (mocked: what a CUDA device with Triton resolves to) through the whole trainer, with the same losses."""
    prov = _train_smoke(tmp_path, "eager")
    assert prov["config"]["model"]["residual"]["routing_impl"] == "auto"
    assert prov["routing"] == {"impl": "auto", "resolved": "eager", "pdl": False}
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused half runs the kernels on the CPU (Triton interpreter); on a GPU: the gpu_smoke command")
    monkeypatch.setattr(R, "resolve_routing_impl", lambda impl, device: "fused" if impl == "auto" else impl)
    prov = _train_smoke(tmp_path, "fused")
    assert prov["routing"] == {"impl": "auto", "resolved": "fused", "pdl": False}  # (no PDL in the interpreter)
    loss = [json.loads((tmp_path / d / "summary.json").read_text())["final_val_loss"] for d in ("eager", "fused")]
    assert loss[1] == pytest.approx(loss[0], rel=1e-5)
