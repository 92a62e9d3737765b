"""Shared glue of the workflow scripts: imports, environment, logging, launching a module.

Every script starts with ``log = start(snakemake)``: it makes the repository's packages
importable (installed or not), exports the configured data directory as ``MHAR_DATA_DIR``
and sends log records to the rule's log file.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]  # workflow/scripts/_glue.py -> repository root
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def start(sm: Any) -> logging.Logger:
    """Prepare a script run by Snakemake; return a logger writing to ``sm.log[0]``."""
    data_dir = sm.config.get("data_dir")
    if data_dir:
        os.environ["MHAR_DATA_DIR"] = str(Path(data_dir).expanduser().resolve())
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    log_path = Path(sm.log[0])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")  # start empty; records and child output are appended in order
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=[logging.FileHandler(log_path, mode="a"), logging.StreamHandler(sys.stderr)],
        force=True,
    )
    return logging.getLogger(f"workflow.{sm.rule}")


def launcher(gpus: int) -> list[str]:
    """How to start a training process: plain Python, or torchrun (DDP, one node) for > 1 GPU."""
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    return [sys.executable]


def run_logged(cmd: Sequence[Any], log_path: str, threads: int = 1) -> None:
    """Run ``cmd`` (stdout and stderr appended to ``log_path``) with ``threads`` CPU threads;
    raise with the tail of the log when it fails."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [str(c) for c in cmd]
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        tail = Path(log_path).read_text().splitlines()[-30:]
        raise RuntimeError(f"command failed with exit code {rc} (log: {log_path}):\n" + "\n".join(tail))
