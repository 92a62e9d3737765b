"""The workflow through a real SLURM: profiles/slurm, snakemake-executor-plugin-slurm, sbatch/squeue/sacct.

A single-node cluster on this machine (scripts/slurm_local.sh: Debian's slurm-wlm + munge; it
installs them when missing, so the test needs root and apt-get, as in CI) runs `reproduce_table1` of
a tiny config (config/ci.yaml, one seed, a few hundred debug steps):

* every job goes through sbatch (the log names their SLURM job ids) and the tables equal those of a
  local run (`--cores 2`) byte for byte;
* one training job is killed with `scancel` after its first checkpoint: the profile's retry submits
  it again and the run resumes from that checkpoint (provenance `resumed_from_step`), still ending
  with the same numbers as the uninterrupted local run;
* without accounting, the plugin's `sacct` status would poll for ever: the workflow stops at once
  with an `error:` line instead (workflow/rules/slurm.smk), while the profile's `squeue` works;
* with accounting (slurmdbd on MariaDB), jobs are followed through `sacct` as well.

The cluster is stopped again at the end (also on failure) unless it was running before the test;
a lock file keeps two test sessions from sharing it.
"""
import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
PROFILE = REPO / "profiles" / "slurm"
MARK = "# written by mhar scripts/slurm_local.sh"
LOCK = Path("/tmp/mhar-slurm-test.lock")
# a few hundred tiny steps: long enough (seconds) to cancel a job between its checkpoints
OVERLAY = {"seeds": [0], "train": {"train": {"steps": 400, "checkpoint_every": 25, "eval_every": 100,
                                              "log_every": 50, "tail_k": 2}}}
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")


def _can_run_cluster() -> str:
    """'' if this machine can run the local cluster, else why not."""
    if sys.platform != "linux":
        return "SLURM test needs Linux"
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (scripts/slurm_local.sh)"
    conf = Path("/etc/slurm/slurm.conf")
    if conf.is_file() and not conf.read_text().startswith(MARK):
        return "a site SLURM is configured here (/etc/slurm/slurm.conf); the test only uses its own local cluster"
    if not shutil.which("sbatch") and not shutil.which("apt-get"):
        return "no SLURM and no apt-get to install it"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[slurm]')"
    return ""


def _skip_unless_cluster_and_data() -> None:
    """Skip a test that runs jobs through the local cluster where it cannot start or the data mirror is missing."""
    why = _can_run_cluster()
    if why:
        pytest.skip(why)
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")


def cluster(*args, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    if check and res.returncode:
        raise AssertionError(f"slurm_local.sh {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


@contextmanager
def local_cluster():
    """Start (install) the local cluster; afterwards leave it as it was found (stopped, or in its mode)."""
    LOCK.touch(exist_ok=True)
    with open(LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test session at a time on the machine's cluster
        before = cluster("status", check=False)
        was = None if before.returncode else ("--accounting" if "accounting=1" in before.stdout else "")
        try:
            cluster("start")
            yield
        finally:
            if was is None:
                cluster("stop", check=False)
            else:
                cluster("start", *([was] if was else []), check=False)


def snakemake(workdir: Path, *args, **popen) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), MHAR_DATA_DIR=str(Path(os.environ["MHAR_DATA_DIR"]).resolve()))
    overlay = workdir / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(OVERLAY))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(REPO / "config" / "ci.yaml"), str(overlay), *args]
    log = open(workdir / "snakemake.out", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, **popen)


def finish(proc: subprocess.Popen, workdir: Path, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(30)
        raise AssertionError(f"snakemake did not finish within {timeout} s:\n"
                             + (workdir / "snakemake.out").read_text()[-4000:])
    return (workdir / "snakemake.out").read_text()


def slurm_jobs() -> list[tuple[str, str, str]]:
    """(job id, comment, state) of the cluster's jobs."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%k|%T"], capture_output=True, text=True,
                         timeout=30).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.count("|") == 2]


def cancel_after_first_checkpoint(workdir: Path, proc: subprocess.Popen, label: str, timeout: float = 240) -> str:
    """scancel the training job of run `label` once its first checkpoint exists; returns its SLURM id."""
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if list(workdir.glob(f"results/runs/{label}/*/seed*/*/checkpoint/state-*.pt.sha256")):
            running = [j for j, comment, state in slurm_jobs()
                       if comment.startswith("rule_train_") and f"_{label}_" in comment and state == "RUNNING"]
            if running:
                subprocess.run(["scancel", running[0]], check=True, timeout=30)
                return running[0]
        time.sleep(0.05)
    raise AssertionError(f"no running training job of {label!r} with a checkpoint within {timeout} s:\n"
                         + (workdir / "snakemake.out").read_text()[-3000:])


def _untimed(path: Path) -> str:
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?", "<time>", path.read_text())


def test_script_usage():
    """The setup script prints its usage for an unknown command and exits 2 (no side effects)."""
    res = subprocess.run(["bash", str(SCRIPT), "frobnicate"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "scripts/slurm_local.sh start" in res.stderr


def test_profile_follows_jobs_with_and_without_accounting():
    """The profile's status command is squeue; it names no account placeholder that sbatch would reject."""
    prof = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert prof["executor"] == "slurm" and prof["slurm-status-command"] == "squeue"
    assert prof["retries"] >= 1 and prof["default-resources"]["runtime"] > 0  # jobs carry a time limit
    assert "slurm_account" not in prof["default-resources"]


@pytest.mark.slow
def test_reproduce_table1_through_real_slurm(tmp_path):
    _skip_unless_cluster_and_data()
    local, remote, guard, acct = (tmp_path / n for n in ("local", "slurm", "guard", "acct"))
    for d in (local, remote, guard, acct):
        d.mkdir()
    fast = ["--slurm-init-seconds-before-status-checks", "2"]  # first status query after 2 s (test speed)

    with local_cluster():
        # the local reference and the SLURM run side by side (the SLURM run mostly waits on polls)
        ref = snakemake(local, "--cores", "2", "reproduce_table1")
        run = snakemake(remote, "--profile", str(PROFILE), *fast, "reproduce_table1")
        cancelled = cancel_after_first_checkpoint(remote, run, "mhar")
        out = finish(run, remote, 420)
        ref_out = finish(ref, local, 300)
        assert ref.returncode == 0, ref_out[-4000:]
        assert run.returncode == 0, out[-6000:]

        # every job went through sbatch: data, two training runs and the resubmitted one
        submitted = SUBMITTED.findall(out)
        assert len(submitted) == 4, out[-4000:]
        assert cancelled in {j for j, _ in submitted}
        assert re.search(rf"SLURM-job '{cancelled}' failed, SLURM status is: 'CANCELLED'", out), out[-4000:]
        # the plugin's log folder: rule_<rule>/<wildcards joined by _>/, the run label first (results/runs/<label>/...)
        retried = [j for j, log in submitted if Path(log).parent.parent.name == "rule_train"
                   and Path(log).parent.name.startswith("mhar_")]
        assert retried[0] == cancelled and len(retried) == 2 and retried[1] != cancelled
        assert not [j for j, _, state in slurm_jobs() if state in ("PENDING", "RUNNING") and j in dict(submitted)]

        # the retry resumed from the checkpoint instead of starting over ...
        (run_dir,) = [p.parent for p in remote.glob("results/runs/mhar/*/seed0/*/summary.json")]
        prov = json.loads((run_dir / "provenance.json").read_text())
        step = prov.get("resumed_from_step")
        assert step is not None and step >= OVERLAY["train"]["train"]["checkpoint_every"], prov.get("resumed_from_step")
        # ... and ended exactly where the uninterrupted local run ended: the same tables, byte for byte
        # (but for the time stamp of their "generated at" line); config/ci.yaml with the test's overlay on top
        # writes them to results/reports/<config hash>/ (workflow/rules/config.smk), the same folder in both
        (reports,) = [p.relative_to(remote) for p in remote.glob("results/reports/*/table1.csv")]
        assert (local / reports).is_file(), sorted(local.glob("results/reports/*/table1.csv"))
        for name in ("table1.csv", "table1.md", "table1.tex"):
            assert _untimed(remote / reports.parent / name) == _untimed(local / reports.parent / name), name
        (ref_dir,) = [p.parent for p in local.glob("results/runs/mhar/*/seed0/*/summary.json")]

        def losses(d):
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            return [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows]

        assert losses(run_dir) == losses(ref_dir)

        # the plugin's default status command (sacct) on a cluster without accounting: an error
        # line at once, no job submitted, instead of waiting for ever
        t0 = time.time()
        bad = snakemake(guard, "--profile", str(PROFILE), "--slurm-status-command", "sacct", "reproduce_table1")
        bad_out = finish(bad, guard, 120)
        assert bad.returncode != 0 and time.time() - t0 < 120
        assert "error: job status through sacct" in bad_out and "accounting storage is disabled" in bad_out
        assert not SUBMITTED.search(bad_out)

        # with accounting (slurmdbd + MariaDB), sacct follows the jobs too
        cluster("start", "--accounting")
        run = snakemake(acct, "--profile", str(PROFILE), *fast, "--slurm-status-command", "sacct",
                        "reproduce_table1", "--until", "prepare_data")
        out = finish(run, acct, 300)
        assert run.returncode == 0, out[-4000:]
        (job,) = [j for j, _ in SUBMITTED.findall(out)]
        sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"], capture_output=True,
                               text=True, timeout=30).stdout.split()
        assert sacct == ["COMPLETED"]
        assert list(acct.glob("results/data/*/shards.json"))


def test_profile_asks_for_sigterm_before_the_time_limit():
    """Training jobs get SIGTERM before their time limit (sent to the job steps, where the trainer runs)."""
    prof = yaml.safe_load((PROFILE / "config.yaml").read_text())
    for rule in ("train", "cpt_pretrain_base", "cpt_train"):
        extra = prof["set-resources"][rule]["slurm_extra"]
        assert re.fullmatch(r"'--signal=TERM@\d+'", extra), (rule, extra)  # not B: (the batch shell only)


def _run_target(workdir: Path) -> str:
    """The one training run of the signal test: label mhar, seed 0 (its path from a dry run)."""
    res = snakemake(workdir, "-n", "--until", "train", "reproduce_table1")
    finish(res, workdir, 120)
    (run,) = set(re.findall(r"output: (results/runs/mhar/[^/]+/seed0/\S+)/summary.json", (workdir / "snakemake.out").read_text()))
    return f"{run}/summary.json"


@pytest.mark.slow
def test_a_training_job_signalled_like_the_time_limit_checkpoints_and_resumes_bit_equal(tmp_path):
    """`scancel --signal=TERM` (what the profile's --signal=TERM@N sends) mid-run: the trainer checkpoints at
    that step and exits 75, the profile's retry resumes from that very checkpoint (the config checkpoints
    only at the end otherwise), and the run ends with the numbers and weights of an uninterrupted local run."""
    _skip_unless_cluster_and_data()
    local, remote = tmp_path / "local", tmp_path / "slurm"
    for d in (local, remote):
        d.mkdir()
    target = _run_target(local)
    with local_cluster():
        ref = snakemake(local, "--cores", "1", target)
        run = snakemake(remote, "--profile", str(PROFILE), "--slurm-init-seconds-before-status-checks", "2",
                        "--config", "train={train: {checkpoint_every: 1000, log_every: 10}}", "--latency-wait", "60",
                        target)  # (--config takes every word up to the next option)
        t0, job = time.time(), None
        while job is None and time.time() - t0 < 240 and run.poll() is None:
            logs = list(remote.glob("results/logs/train/mhar/*/seed0/*.log"))
            if logs and "[mhar.train] step 30 " in logs[0].read_text():
                running = [j for j, comment, state in slurm_jobs()
                           if comment.startswith("rule_train_") and state == "RUNNING"]
                if running:
                    job = running[0]
                    subprocess.run(["scancel", "--signal=TERM", job], check=True, timeout=30)
            time.sleep(0.05)
        assert job is not None, (remote / "snakemake.out").read_text()[-3000:]
        out = finish(run, remote, 300)
        ref_out = finish(ref, local, 300)
        assert ref.returncode == 0, ref_out[-3000:]
        assert run.returncode == 0, out[-6000:]
    submitted = [j for j, log in SUBMITTED.findall(out) if Path(log).parent.parent.name == "rule_train"]
    assert len(submitted) == 2 and submitted[0] == job, out[-4000:]
    (run_dir,) = [p.parent for p in remote.glob("results/runs/mhar/*/seed0/*/summary.json")]
    (ref_dir,) = [p.parent for p in local.glob("results/runs/mhar/*/seed0/*/summary.json")]
    log = "\n".join(p.read_text() for p in remote.glob("results/logs/train/mhar/*/seed0/*.log"))
    step = json.loads((run_dir / "provenance.json").read_text())["resumed_from_step"]
    assert step is not None and 30 <= step < OVERLAY["train"]["train"]["steps"], step
    # the first segment's own line, left in the plugin's log of the signalled job
    slurm_logs = "\n".join(p.read_text() for p in remote.glob(f".snakemake/slurm_logs/rule_train/*/{job}.log"))
    assert f"stopped at step {step} by SIGTERM; rerun to resume" in slurm_logs + log, slurm_logs[-3000:]

    def losses(d):
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows]

    assert losses(run_dir) == losses(ref_dir)
    assert (run_dir / "model.pt").read_bytes() == (ref_dir / "model.pt").read_bytes()
