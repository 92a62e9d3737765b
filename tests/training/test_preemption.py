"""Preemption: SIGTERM / SIGUSR1 / SIGINT finish the step, checkpoint, exit 75 with one line; a rerun
ends bit-equal to an uninterrupted run (the trainer's CLI in a subprocess, signalled mid-run).
The same through SLURM with the profile's signal: tests/workflow/test_slurm.py."""
from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import mhar.training.train as T
from mhar.runs.config import load_run_config
from mhar.training.preemption import EXIT_PREEMPTED, Preempted, StopSignals
from test_train import corpus, read_metrics  # noqa: F401  (corpus is a fixture)

REPO = Path(__file__).resolve().parents[2]
STEPS = 60


def test_stop_signals_set_a_flag_and_restore_the_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    with StopSignals() as stop:
        assert stop.requested() == 0
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered before os.kill returns (to this thread)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested() == signal.SIGUSR1  # the first signal names the stop
    assert {s: signal.getsignal(s) for s in before} == before
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C twice: now
            os.kill(os.getpid(), signal.SIGINT)
    assert str(Preempted(7, signal.SIGTERM)) == "stopped at step 7 by SIGTERM; rerun to resume"
    assert EXIT_PREEMPTED not in (0, 1, 2, 130, 143)  # not an error, not a death by signal


def _config(corpus: Path, tmp: Path) -> Path:
    cfg = {"model": {"preset": "debug"},
           "data": {"corpus": str(corpus), "cache_dir": str(tmp / "cache"), "seq_len": 32, "val_tokens": 256},
           "train": {"steps": STEPS, "global_batch": 4, "micro_batch": 2, "warmup_steps": 2, "eval_every": 20,
                     "tail_k": 2, "checkpoint_every": 1000, "log_every": 1, "threads": 1, "lr": 3e-3, "device": "cpu"}}
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _trainer(config: Path, out: Path, **popen) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "mhar.train", str(config), "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted run of the config (in this process)."""
    tmp = tmp_path_factory.mktemp("reference")
    config = _config(corpus, tmp)
    T.train(load_run_config(config), tmp / "run")
    return config, tmp / "run"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_trainer_checkpoints_exits_75_and_a_rerun_ends_bit_equal(reference, tmp_path, sig):
    config, ref = reference
    out = tmp_path / "run"
    at = random.Random().randrange(2, STEPS // 2)
    proc = _trainer(config, out)
    for line in proc.stdout:  # the progress lines: "[mhar.train] step k loss ..." (log_every=1)
        if line.startswith(f"[mhar.train] step {at} loss"):
            proc.send_signal(sig)
            break
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, (at, err[-3000:])
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    name = signal.Signals(sig).name
    stopped = int(lines[0].split()[3])
    assert lines[0] == f"stopped at step {stopped} by {name}; rerun to resume"
    assert at <= stopped < STEPS
    assert (out / "checkpoint" / f"state-{stopped:08d}.pt").is_file() and not (out / "model.pt").exists()
    assert [r["step"] for r in read_metrics(out) if r["split"] == "train"] == list(range(1, stopped + 1))

    again = _trainer(config, out)
    stdout, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert f"resuming {out} from step {stopped}" in stdout
    assert _sha(out / "model.pt") == _sha(ref / "model.pt")
    assert read_metrics(out) == read_metrics(ref)


def _rank_worker(rank: int, port: int, corpus: str, cache: str, out: str) -> None:
    """DDP on 2 CPU processes; only rank 1 is sent SIGUSR1 (during step 3): both ranks stop after step 3."""
    import json as _json

    import torch

    from test_train import cfg_for

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    cfg = cfg_for(Path(corpus), Path(cache), "train.steps=6", "train.checkpoint_every=100")
    step = T._train_step

    def signalled_step(run):
        if rank == 1 and run.prog.step == 2:  # during step 3, on this rank only
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(run)

    T._train_step = signalled_step
    try:
        T.train(cfg, Path(out))
        got = {"finished": True}
    except Preempted as e:
        got = {"step": e.step, "signal": signal.Signals(e.signum).name}
    Path(out, f"rank{rank}.json").write_text(_json.dumps(got))


def test_ranks_agree_to_stop_when_one_of_them_is_signalled(corpus, tmp_path):
    import socket
    import json

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    ctx = mp.spawn(_rank_worker, args=(port, str(corpus), str(tmp_path / "cache"), str(out)), nprocs=2, join=False)
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:  # ranks that disagree wait in each other's collectives for ever
            for p in ctx.processes:
                p.kill()
            pytest.fail("the two ranks did not finish within 240 s (hang)")
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert got == [{"step": 3, "signal": "SIGUSR1"}] * 2
    assert sorted(p.name for p in (out / "checkpoint").glob("state-*.pt")) == ["state-00000003.pt"]
