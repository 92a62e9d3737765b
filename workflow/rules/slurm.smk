# SLURM (profiles/slurm, snakemake-executor-plugin-slurm): before the first job is submitted,
# check that the job status command the plugin will use can follow jobs on this cluster. The
# plugin waits forever for a job its status command never reports (e.g. `sacct` where accounting
# is off: "Slurm accounting storage is disabled"); here that is one `error:` line instead.

import shutil
import subprocess


def _slurm_min_job_age():
    """MinJobAge (s) from `scontrol show config`; None if it cannot be read."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MinJobAge":
            digits = value.strip().split()[0] if value.strip() else ""
            return int(digits) if digits.isdigit() else None
    return None


def slurm_status_problem(settings):
    """None if the plugin's status command can see jobs here, else what is wrong and what to do.

    Mirrors the plugin's choice (2.8): `squeue` falls back to `sacct` where MinJobAge is below 3x the
    first status delay and sacct exists; `sacct` falls back to `squeue` where sacct does not exist.
    """
    command = getattr(settings, "status_command", None) or "sacct"
    delay = getattr(settings, "init_seconds_before_status_checks", None) or 40
    min_age = _slurm_min_job_age()
    has_sacct = shutil.which("sacct") is not None
    why = f"--slurm-status-command {command}"
    if command == "squeue" and has_sacct and (min_age is None or min_age < 3 * delay):
        command = "sacct"
        why = f"MinJobAge={min_age} s is below 3 x {delay} s, so the plugin uses sacct"
    if command == "sacct" and not has_sacct:
        command = "squeue"
    if command != "sacct":
        return None
    try:
        res = subprocess.run(
            ["sacct", "-X", "--parsable2", "--noheader", "--format=JobIdRaw,State"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        res = subprocess.CompletedProcess([], 1, "", "sacct did not answer within 60 s")
    if res.returncode == 0:
        return None
    said = (res.stderr or res.stdout).strip().splitlines()
    return (
        f"job status through sacct ({why}), but sacct cannot see jobs on this cluster "
        f"({said[-1] if said else f'exit {res.returncode}'}): Snakemake would wait for ever. "
        "Use --slurm-status-command squeue (profiles/slurm's default) on a cluster without "
        "accounting; with MinJobAge under 3 x --slurm-init-seconds-before-status-checks, lower "
        "that delay (or ask for a MinJobAge of at least 300 s)"
    )


onstart:
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.name == "slurm":
        problem = slurm_status_problem(workflow.executor_settings)
        if problem:
            raise WorkflowError(f"error: {problem}")
