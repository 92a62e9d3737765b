"""Shared helpers of the benchmark scripts: environment columns, HBM bandwidth, CSV output.

Every CSV row carries the GPU model, driver, torch and triton versions, the git
commit (when known) and the exact command that produced it.
"""
from __future__ import annotations

import csv
import io
import shlex
import sys
from pathlib import Path

import torch

from mhar.atomic import atomic_write_text
from mhar.model.presets import PRESETS
from mhar.model.routing import kernel_env
from mhar.model.routing.names import PDL_ENV
from mhar.runs.provenance import git_info, hardware_info, package_versions


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


def microbatch(size: str) -> tuple[int, int]:
    """The micro-batch (B sequences, T tokens) a benchmark runs ``size`` at: its preset's ``micro_batch``
    (``mhar.model.presets``; the paper's for 100M/350M/1B, CPU-sized for debug / tiny)."""
    p = PRESETS.get(size)
    if p is None or p.micro_batch is None:
        runs = ", ".join(n for n, q in PRESETS.items() if q.micro_batch is not None)
        raise SystemExit(f"error: size {size!r} has no benchmark micro-batch (mhar.model.presets); use one of {runs}")
    return p.micro_batch

# The one kernel-setting suffix of a benchmark's routing name (routing-op impl ``fused_nopdl``, training variant
# ``mhar_fused_nopdl``): the fused kernels launched without programmatic dependent launch (MHAR_ROUTING_PDL=0). A
# name without it runs the library's default (the variable unset), whatever the caller's environment, so a name
# always means the same launches.
NO_PDL = "_nopdl"


def kernel_settings(name: str) -> tuple[str, dict]:
    """``name`` without the ``NO_PDL`` suffix, and the routing kernel settings of its process: {MHAR_ROUTING_PDL:
    "0"} with the suffix, {MHAR_ROUTING_PDL: None} (unset: the default) without."""
    if name.endswith(NO_PDL):
        return name[: -len(NO_PDL)], {PDL_ENV: "0"}
    return name, {PDL_ENV: None}


def apply_settings(env: dict, settings: dict) -> dict:
    """``env`` (a copy) with ``settings`` applied: a value None removes the variable."""
    out = dict(env)
    for k, v in settings.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def routing_env_cell(env: dict | None = None) -> str:
    """Kernel settings (``mhar.model.routing.kernel_env()``, or ``env`` as a provenance.json holds them) as one CSV cell:
    "K=V K=V", empty for the defaults."""
    return " ".join(f"{k}={v}" for k, v in (kernel_env() if env is None else env).items())


def measure_hbm_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median of 20 copies."""
    import triton.testing  # lazy: triton, only on a GPU

    n = int(gib * 2**30) // 4
    a = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


def add_out_args(ap, default: str) -> None:
    """``--out`` and ``--append`` of a benchmark that writes a CSV record."""
    ap.add_argument("--out", default=default, help="CSV to write; an existing one is kept unless --append")
    ap.add_argument("--append", action="store_true",
                    help="add this run's rows to an existing --out (its rows are kept; columns are merged)")


def existing_rows(path: str | Path, append: bool) -> list[dict]:
    """Rows of ``path`` to keep in front of this run's rows (``--append``), or [] when it does not exist yet.
    An existing record without ``--append`` is refused before anything runs (one ``error:`` line, exit 2):
    a benchmark never overwrites an earlier measurement (e.g. the committed results/bench/*.csv)."""
    path = Path(path)
    if not path.exists():
        return []
    if not append:
        print(f"error: {path} already exists (an earlier record); pass --append to add this run's rows to it, "
              "or --out a new file", file=sys.stderr)
        raise SystemExit(2)
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        print(f"error: --append: cannot read {path} as CSV ({e}); fix or move it, or --out a new file",
              file=sys.stderr)
        raise SystemExit(2)


def write_csv(path: str | Path, rows: list[dict], keep: list[dict] = ()) -> None:
    """Write ``keep`` (rows already in the record) and then ``rows`` to ``path`` atomically (temp file +
    rename: a killed run leaves the previous file whole), creating parent folders; the header is the union
    of the columns, in order of first appearance (missing cells empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in [*keep, *rows] for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, restval="")
    w.writeheader()
    w.writerows([*keep, *rows])
    atomic_write_text(path, buf.getvalue())
    print(f"wrote {path} ({len(keep)} kept + {len(rows)} new rows)" if keep else f"wrote {path} ({len(rows)} rows)")


def tuned_lines(seen: set | None = None) -> list[str]:
    """One line per launch configuration the fused routing's autotuner has chosen (kernel, shape / loop-length
    bucket key -> BLOCK_T, warps, stages), skipping keys in ``seen`` (which it extends): logged next to timings
    so a run's configuration choices can be compared across sessions."""
    from mhar.model.routing import _kernels  # lazy: the Triton kernels (triton), only on a GPU
    lines = []
    for key, cfg in _kernels._TUNED.items():
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        lines.append(f"TUNED {key[0]} {key[1:6]}: {cfg}")
    return lines
