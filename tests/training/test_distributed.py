"""Multi-process training on CPU (gloo, 2 processes): DDP and FSDP2 equal one process.

One spawn per parallel mode trains the routed variant (MHAR, eager routing; its pseudo-queries and
key norms are sharded parameters of the FSDP2 root) three times on 2 processes: uninterrupted, and
stopped after step 2 then resumed. The reference is one process with the same global batch through
gradient accumulation (global batch 8, micro-batch 2: accumulation 4 on one process, 2 per rank).
The validation set holds 5 sequences, so the ranks get unequal numbers of validation batches.

Tolerance (1 process vs 2): everything is fp32 on CPU and the two computations differ only in the
order of the gradient sums (per-rank accumulation, then the all-reduce mean), a relative effect of
~1e-7 per step; rel 1e-5 over 4 AdamW steps leaves a margin of 10x, while any real fault (a rank's
share missing or doubled, a wrong division by the world size or the accumulation count, a rank's
stale gradients) moves the step-2 loss by more than 1e-3. Resume on 2 processes must be exact.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

import mhar.training.train as T
from mhar.runs.checkpoint import load_model
from mhar.training.distributed import DistEnv, even_batches, gather_batches, init_distributed, shutdown, wrap_model
from mhar.model.transformer import Transformer
from test_train import cfg_for, corpus, read_metrics  # noqa: F401  (corpus is a fixture)

WORLD = 2
REL = 1e-5
COMMON = ("train.steps=4", "train.global_batch=8", "train.micro_batch=2", "train.log_batch_hash=true",
          "data.val_tokens=160", "model.residual.variant=mhar", "model.residual.heads=4",
          "model.residual.routing_impl=eager")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _join(port: int, rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))


def _worker(rank: int, ports: list[int], parallel: str, corpus: str, cache: str, out: str) -> None:
    torch.set_num_threads(1)
    cfg = cfg_for(Path(corpus), Path(cache), *COMMON, f"train.parallel={parallel}")
    _join(ports[0], rank)
    T.train(cfg, Path(out) / "full")
    _join(ports[1], rank)
    assert T.train(cfg, Path(out) / "resumed", stop_after=2) is None
    _join(ports[2], rank)
    T.train(cfg, Path(out) / "resumed")
    # the helpers on their own: the wrapped parameters, the gathered step, the padded validation split
    _join(ports[3], rank)
    env = init_distributed("cpu", parallel)
    try:
        torch.manual_seed(0)
        model = wrap_model(Transformer(cfg.model), env)
        placement = {n: (type(p).__name__, str(getattr(p, "placements", "")), list(p.to_local().shape)
                         if hasattr(p, "to_local") else list(p.shape)) for n, p in model.named_parameters()}
        # Drop the wrapper while its process group lives (as mhar.train does: the model goes with _train, then
        # the group): a DDP reducer freed after destroy_process_group holds the last reference to the gloo group,
        # whose destructor then joins a worker thread that waits for the GIL this thread holds (seen: a worker hung
        # at exit in CI, torch 2.13 CPU).
        del model  # (shutdown collects it while the group lives)
        batches = [(torch.full((2, 3), 10 * rank + i), torch.full((2, 3), -10 * rank - i)) for i in range(2)]
        gathered = [[x.tolist(), y.tolist()] for x, y in gather_batches(batches, env)]
        val = [(torch.full((1, 3), rank), torch.full((1, 3), rank))] * (2 - rank)  # rank 0: 2, rank 1: 1
        padded = [[x.tolist(), w] for x, _, w in even_batches(val, env)]
        (Path(out) / f"helpers_rank{rank}.json").write_text(json.dumps(
            {"placement": placement, "gathered": gathered, "padded": padded}))
    finally:
        shutdown(env)


def _spawn(parallel: str, corpus: Path, cache: Path, out: Path, timeout_s: float = 300) -> None:
    """Run the workers; a hang (e.g. mismatched collectives) fails the test instead of blocking it."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(_worker, args=(_free_ports(4), parallel, str(corpus), str(cache), str(out)),
                   nprocs=WORLD, join=False)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{parallel} on {WORLD} processes did not finish within {timeout_s:.0f} s (hang)")


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("single")
    T.train(cfg_for(corpus, root / "cache", *COMMON), root / "run")
    return root


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def multi(request, corpus, single) -> tuple[str, Path]:
    out = single.parent / f"{request.param}_{single.name}"
    _spawn(request.param, corpus, single / "cache", out)
    return request.param, out


def _weights(run: Path) -> dict:
    return load_model(run / "model.pt")[0].state_dict()


def test_losses_equal_one_process_with_accumulation(single, multi):
    parallel, out = multi
    one, two = read_metrics(single / "run"), read_metrics(out / "full")
    assert [(r["split"], r["step"], r["tokens"]) for r in one] == [(r["split"], r["step"], r["tokens"]) for r in two]
    assert [r["split"] for r in one].count("val") == 2
    for a, b in zip(one, two):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=REL), (parallel, a["step"], key)
    w1, w2 = _weights(single / "run"), _weights(out / "full")
    assert w1.keys() == w2.keys()
    for k in w1:  # the exported (for FSDP: gathered) weights
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{parallel} {k}: {m}")
    prov = json.loads((out / "full" / "provenance.json").read_text())
    assert (prov["world_size"], prov["parallel"]) == (WORLD, parallel)


def test_logged_batch_hash_is_the_global_batch(single, multi):
    """The union of the ranks' shares is the one-process batch, in order (train.log_batch_hash)."""
    _, out = multi
    one = [r["batch_sha256"] for r in read_metrics(single / "run") if r["split"] == "train"]
    two = [r["batch_sha256"] for r in read_metrics(out / "full") if r["split"] == "train"]
    assert len(set(one)) == 4 and two == one


def test_resume_after_stop_equals_uninterrupted(multi):
    parallel, out = multi
    assert read_metrics(out / "resumed") == read_metrics(out / "full")
    prov = json.loads((out / "resumed" / "provenance.json").read_text())
    assert [r["step"] for r in prov["resumes"]] == [2]
    full, resumed = _weights(out / "full"), _weights(out / "resumed")
    for k in full:
        assert torch.equal(full[k], resumed[k]), (parallel, k)
    s1, s2 = (json.loads((out / d / "summary.json").read_text()) for d in ("full", "resumed"))
    assert s1["val_losses"] == s2["val_losses"]


def test_helpers_gather_pad_and_shard(multi):
    parallel, out = multi
    ranks = [json.loads((out / f"helpers_rank{r}.json").read_text()) for r in range(WORLD)]
    # gather_batches: both ranks get every rank's micro-batches, in rank order
    expect = [[[[10 * r + i] * 3] * 2, [[-10 * r - i] * 3] * 2] for r in range(WORLD) for i in range(2)]
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == expect
    # even_batches: rank 1 pads its one batch with a weight-0 copy up to rank 0's two
    assert ranks[0]["padded"] == [[[[0] * 3], 1.0], [[[0] * 3], 1.0]]
    assert ranks[1]["padded"] == [[[[1] * 3], 1.0], [[[1] * 3], 0.0]]
    place = ranks[0]["placement"]
    if parallel == "ddp":
        assert all(kind == "Parameter" for kind, _, _ in place.values())
        return
    # FSDP2: every parameter (the routing pseudo-queries and key norms included) is a DTensor
    # sharded on dim 0; the 5 routing rows split 3 + 2 over the ranks
    assert all(kind == "DTensor" and "Shard(dim=0)" in pl for kind, pl, _ in place.values()), place
    for name in ("residual.queries", "residual.key_norms"):
        shapes = [rk["placement"][name][2] for rk in ranks]
        assert shapes == [[3, 64], [2, 64]], (name, shapes)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="a machine with 2 GPUs runs the check itself")
def test_multigpu_check_refuses_too_few_gpus(tmp_path, capsys):
    from benchmarks.multigpu_check import main

    out = tmp_path / "out"
    assert main(["--out", str(out), "--device", "cuda", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --nproc 2 needs 2 visible GPUs") and err.count("\n") == 1
    assert not out.exists()
