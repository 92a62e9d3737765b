"""Shared glue of the workflow scripts: imports, environment, logging, launching a module.

Every script starts with ``log = start(snakemake)``: it makes the repository's packages
importable (installed or not), refuses a job whose outputs or logs would land outside the config's
``results_dir`` / ``reports_dir`` (``check_outputs_inside``: the config check refuses such labels; this is
the check where the files are written), and sends log records to the rule's log file. The workflow's
``data_dir`` travels as data: ``with_data_dir`` puts it into a run config (``data.data_dir``),
``data_dir`` gives it to evaluation (``--data-dir`` / ``data_dir=``); nothing is exported.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]  # workflow/scripts/_glue.py -> repository root
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def check_outputs_inside(sm: Any) -> None:
    """Stop (one `error:` line, exit 1, nothing written) when an output or log of the job, resolved (``..`` and
    links followed), is not inside the config's ``results_dir`` or ``reports_dir``."""
    roots = [Path(sm.config[k]).expanduser().resolve() for k in ("results_dir", "reports_dir") if sm.config.get(k)]
    for path in [*sm.output, *sm.log]:
        where = Path(path).expanduser().resolve()
        if not any(where == root or root in where.parents for root in roots):
            raise SystemExit(f"error: rule {sm.rule}: output {str(path)[:200]} resolves to {str(where)[:200]}, "
                             f"outside results_dir and reports_dir ({', '.join(map(str, roots))}); refusing to "
                             "write it (a label or path in the config leaves the results folder: rename it)")


def start(sm: Any) -> logging.Logger:
    """Prepare a script run by Snakemake; return a logger writing to ``sm.log[0]``."""
    check_outputs_inside(sm)
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


def data_dir(sm: Any) -> str | None:
    """The workflow config's ``data_dir`` as an absolute path, or None (then the library's default:
    ``$MHAR_DATA_DIR`` if set, else the Hugging Face hub; see ``mhar.env``)."""
    d = sm.config.get("data_dir")
    return str(Path(d).expanduser().resolve()) if d else None


def with_data_dir(run_config: dict, sm: Any) -> dict:
    """``run_config`` with ``data.data_dir`` = the workflow's ``data_dir`` unless the run config sets its
    own (a location: ``mhar.runs.config`` hashes it as null, so the results hash does not change)."""
    d = data_dir(sm)
    if d is None or (run_config.get("data") or {}).get("data_dir"):
        return run_config
    return {**run_config, "data": {**(run_config.get("data") or {}), "data_dir": d}}


def launcher(gpus: int) -> list[str]:
    """How to start a training process: plain Python, or torchrun (DDP, one node) for > 1 GPU."""
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    return [sys.executable]


def run_logged(cmd: Sequence[Any], log_path: str, threads: int = 1) -> None:
    """Run ``cmd`` (stdout and stderr appended to ``log_path``) with ``threads`` CPU threads;
    raise with the tail of the log when it fails.

    SIGTERM and SIGUSR1 (SLURM's warning before a time limit, see profiles/slurm) are passed on to the
    command and this script waits for it: the trainer checkpoints and exits 75, the job fails, and
    Snakemake's retry resumes the run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [str(c) for c in cmd]
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        forward = lambda signum, frame: proc.send_signal(signum)  # noqa: E731
        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            rc = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if rc != 0:
        tail = Path(log_path).read_text().splitlines()[-30:]
        raise RuntimeError(f"command failed with exit code {rc} (log: {log_path}):\n" + "\n".join(tail))
