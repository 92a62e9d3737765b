"""Provenance for every result: code version, packages, hardware, command, time.

    from mhar.runs.provenance import collect_provenance
    prov = collect_provenance(config_dict)   # JSON-serialisable dict

Keys: ``time_utc``, ``hostname``, ``command`` (argv), ``cwd``, ``git`` ({commit, dirty, root}),
``packages`` ({python, torch, triton, numpy, mhar, ...}), ``hardware`` ({platform, cpu, cpu_count,
cuda_available, cuda, cudnn, gpus: [{name, memory_gb}], driver}), ``routing_env`` (the fused kernels'
``MHAR_ROUTING_*`` settings), ``routing_pdl`` (whether they launch with programmatic dependent launch here: the
default on sm_90+, so the settings alone do not say), and, when a config is given,
``config`` and ``config_hash`` (``mhar.model.config.config_hash`` of it). ``config_hash`` has this one meaning in
every record: the hash of the config recorded beside it, as given (paths and execution choices included). A
training run's identity is a different key, ``identity`` (``mhar.runs.config.identity_hash``), which
``mhar.train`` adds with ``pairing`` and ``run``. Nothing here raises: a piece that cannot be determined is
recorded as ``None``.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from mhar.model.config import config_hash

__all__ = ["collect_provenance", "routing_env", "routing_pdl", "git_info", "package_versions", "hardware_info", "utc_now"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_PACKAGES = ("torch", "triton", "numpy", "mhar", "datasets", "tokenizers", "transformers", "lm_eval", "pyyaml")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _run(cmd: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def git_info(path: Path = _REPO_ROOT) -> dict:
    """Commit sha of the checkout holding ``path`` and whether tracked files differ from it."""
    commit = _run(["git", "rev-parse", "HEAD"], path)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], path)
    return {"commit": commit, "dirty": None if status is None else bool(status), "root": str(path)}


def _local_version() -> Optional[str]:
    try:
        import tomllib  # lazy: Python >= 3.11 only (3.10: no version recorded)

        return tomllib.loads((_REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    except Exception:
        return None


def package_versions() -> dict:
    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version({"lm_eval": "lm-eval", "pyyaml": "PyYAML"}.get(name, name))
        except importlib.metadata.PackageNotFoundError:
            out[name] = _local_version() if name == "mhar" else None
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__  # the imported one (may differ from metadata in odd envs)
    return out


def _cpu_model() -> Optional[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def hardware_info() -> dict:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cuda_available": False,
        "cuda": None,
        "cudnn": None,
        "gpus": [],
        "driver": None,
    }
    try:
        import torch  # lazy: the torch-free stages (analysis) record provenance too

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["cuda_available"] = True
            info["cudnn"] = torch.backends.cudnn.version()
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                info["gpus"].append({"name": p.name, "memory_gb": round(p.total_memory / 2**30, 2),
                                     "capability": f"{p.major}.{p.minor}"})
            drv = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
            info["driver"] = drv.splitlines()[0].strip() if drv else None
    except Exception:  # provenance must never break a run
        pass
    return info


def routing_env() -> Optional[dict]:
    """The fused routing kernels' ``MHAR_ROUTING_*`` settings of this process (``mhar.model.routing.kernel_env``): they
    change a run's speed (autotuning, launch mode), not its results. None if it cannot be determined."""
    try:  # torch and the kernels load only here: this module stays importable without them
        from mhar.model.routing import kernel_env

        return kernel_env()
    except Exception:  # provenance must never break a run
        return None


def routing_pdl() -> Optional[bool]:
    """Whether the fused routing kernels launch with programmatic dependent launch on this process's CUDA device
    (``mhar.model.routing._kernels.pdl_enabled``: on by default on sm_90+, ``MHAR_ROUTING_PDL=0`` off); False without
    CUDA; None if it cannot be determined (no Triton, an invalid setting)."""
    try:  # torch and the kernels load only here: this module stays importable without them
        import torch  # lazy: the torch-free stages (analysis) record provenance too

        if not torch.cuda.is_available():
            return False
        from mhar.model.routing import _kernels  # lazy: torch and triton, as above

        return bool(_kernels.pdl_enabled(torch.device("cuda")))
    except Exception:  # provenance must never break a run
        return None


def collect_provenance(config: Optional[dict] = None) -> dict:
    """Everything needed to say where a result came from (see module docstring)."""
    prov: dict[str, Any] = {
        "time_utc": utc_now(),
        "hostname": socket.gethostname(),
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "git": git_info(),
        "packages": package_versions(),
        "hardware": hardware_info(),
        "routing_env": routing_env(),
        "routing_pdl": routing_pdl(),
    }
    if config is not None:
        prov["config"] = config
        prov["config_hash"] = config_hash(config)
    return prov
