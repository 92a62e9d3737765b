"""Batch identity of two continued-pretraining arms (``python -m mhar.cpt check-batches``).

Both arms are trained with ``train.log_batch_hash`` (``mhar.training.optim.batch_digest`` of every step's
batch in ``metrics.jsonl``); :func:`compare_batch_logs` proves they saw byte-identical batches.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["batch_hashes", "compare_batch_logs"]


def batch_hashes(run_dir: str | Path) -> dict[int, str]:
    """{step: batch_sha256} from a run's metrics.jsonl (runs trained with train.log_batch_hash)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: train the run first")
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("split") == "train":
            if "batch_sha256" not in row:
                raise ValueError(f"{path}: step {row.get('step')} has no batch_sha256; "
                                 "train with train.log_batch_hash=true")
            out[int(row["step"])] = row["batch_sha256"]
    return out


def compare_batch_logs(run_a: str | Path, run_b: str | Path) -> dict:
    """Check that two runs saw byte-identical batches at every step; return a small report.

    Raises ValueError naming the first differing step, or when the step sets differ.
    """
    a, b = batch_hashes(run_a), batch_hashes(run_b)
    if set(a) != set(b):
        raise ValueError(f"{run_a} and {run_b} logged different steps ({len(a)} vs {len(b)} train steps)")
    bad = [s for s in sorted(a) if a[s] != b[s]]
    if bad:
        raise ValueError(f"{run_a} and {run_b} saw different batches at {len(bad)} step(s), first at step {bad[0]} "
                         f"({a[bad[0]][:12]} vs {b[bad[0]][:12]}); the arms are not schedule-matched")
    digest = hashlib.sha256("".join(a[s] for s in sorted(a)).encode()).hexdigest()
    return {"run_a": str(run_a), "run_b": str(run_b), "steps": len(a), "identical": True, "all_batches_sha256": digest}
