"""Ctrl-C twice, the second while torch.save writes a checkpoint: reported as the interrupt (exit 130,
"interrupted"), never as "torch.save could not write the file" (exit 2), with the last complete checkpoint
kept. Before the fix this happened whenever the second SIGINT's handler ran inside the writer's Python
callback (torch's C++ archive writer turns whatever the callback raises into a RuntimeError): about 2 in 3.

The interrupt is delivered deterministically and for real: the checkpoint's temp file is a FIFO (named as the
trainer names it), so the trainer's write blocks in the kernel once the pipe is full; then two SIGINTs go to
its main thread, the first while the write is blocked (it sets the stop flag), the second too (Ctrl-C twice).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OVERRIDES = ["model.preset=debug", "data.corpus=synthetic:20000", "data.seq_len=32", "data.val_tokens=128",
             "train.steps=6", "train.global_batch=2", "train.micro_batch=2", "train.warmup_steps=1",
             "train.eval_every=3", "train.tail_k=1", "train.checkpoint_every=1", "train.threads=1",
             "train.lr=3e-3", "train.device=cpu"]

_DRIVER = r"""
import os, signal, sys, threading, time
from pathlib import Path
import mhar.training.cli as CLI
from mhar.atomic import tmp_of

out, cache = sys.argv[1], sys.argv[2]
args = [*sys.argv[3:], f"data.cache_dir={cache}", "--out", out]
first = CLI.main(["config/train/cpu_tiny.yaml", *args, "--stop-after", "1"])
print("first run:", first, flush=True)
fifo = tmp_of(Path(out) / "checkpoint" / "state-00000002.pt")  # the temp file of the next checkpoint
os.mkfifo(fifo)
main_thread = threading.main_thread().ident

def ctrl_c_twice():
    with open(fifo, "rb") as reader:  # opens once the trainer opens its temp file for writing
        time.sleep(1.0)  # the trainer fills the pipe and blocks in write()
        signal.pthread_kill(main_thread, signal.SIGINT)
        time.sleep(0.5)
        signal.pthread_kill(main_thread, signal.SIGINT)
        while reader.read(1 << 16):  # drain: the trainer's file closes on its way out
            pass
    print("signals sent", flush=True)

threading.Thread(target=ctrl_c_twice, daemon=True).start()
rc = CLI.main(["config/train/cpu_tiny.yaml", *args])
time.sleep(0.2)
sys.exit(rc)
"""


def test_ctrl_c_twice_inside_torch_save_is_the_interrupt(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", _DRIVER, str(out), str(tmp_path / "cache"), *OVERRIDES],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "first run: 0" in res.stdout and "signals sent" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 130, res.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("interrupted;"), res.stderr[-3000:]
    assert "torch.save" not in res.stderr and "Traceback" not in res.stderr
    # the last complete checkpoint is kept and verifies; the interrupted write left nothing behind
    from mhar.runs.checkpoint import verify_sha256

    states = sorted(p.name for p in (out / "checkpoint").iterdir())
    assert states == ["state-00000001.pt", "state-00000001.pt.sha256"], states
    verify_sha256(out / "checkpoint" / "state-00000001.pt")
