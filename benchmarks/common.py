"""Shared helpers of the benchmark scripts: environment columns, HBM bandwidth, CSV output.

Every CSV row carries the GPU model, driver, torch and triton versions, the git
commit (when known) and the exact command that produced it.
"""
from __future__ import annotations

import csv
import shlex
import sys
from pathlib import Path

import torch

from mhar.provenance import git_info, hardware_info, package_versions


def command_line(module: str | None = None, argv: list[str] | None = None) -> str:
    """The command that reproduces a script's output: ``python -m MODULE ARGV`` (``argv`` None: this
    process's arguments), or this process's own ``sys.argv`` when no module is named."""
    args = ["-m", module, *(sys.argv[1:] if argv is None else argv)] if module else sys.argv
    return "PYTHONPATH=. python " + " ".join(shlex.quote(a) for a in args)


def env_columns(module: str | None = None, argv: list[str] | None = None) -> dict:
    """Provenance columns appended to every benchmark row (``command``: see ``command_line``)."""
    hw, pk = hardware_info(), package_versions()
    gpu = hw["gpus"][0]["name"] if hw["gpus"] else hw["cpu"]
    return {
        "gpu": gpu,
        "driver": hw["driver"],
        "cuda": hw["cuda"],
        "torch": pk["torch"],
        "triton": pk["triton"],
        "git_commit": git_info()["commit"],
        "command": command_line(module, argv),
    }


def measure_hbm_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median of 20 copies."""
    import triton.testing

    n = int(gib * 2**30) // 4
    a = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


def write_csv(path: str | Path, rows: list[dict]) -> None:
    """Write rows (dicts with the same keys) to ``path``, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")


def tuned_lines(seen: set | None = None) -> list[str]:
    """One line per launch configuration the fused routing's autotuner has chosen (kernel, shape / loop-length
    bucket key -> BLOCK_T, warps, stages), skipping keys in ``seen`` (which it extends): logged next to timings
    so a run's configuration choices can be compared across sessions."""
    from mhar.routing import _kernels
    lines = []
    for key, cfg in _kernels._TUNED.items():
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        lines.append(f"TUNED {key[0]} {key[1:6]}: {cfg}")
    return lines
