"""The Snakemake workflow (Snakefile, workflow/, config/, profiles/).

* dry runs of every target with the default and the paper configs (no data, no GPU needed),
  with job counts checked against the config files themselves;
* `snakemake --lint`: only the one justified warning kind remains;
* the CI-sized end-to-end run (config/ci.yaml) into a temporary directory, then: a second
  invocation has nothing to do, an added seed trains only the new runs, and a changed
  hyper-parameter trains into a new results hash instead of overwriting.

Every workflow invocation runs in a temporary working directory (`-d`), never in the repo.
"""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("reproduce_table1", "reproduce_downstream", "reproduce_heads", "reproduce_seeds",
           "reproduce_cpt", "reproduce_cost", "report", "all")
# config name -> config files; the CPT arm is an overlay (config/cpt*.yaml) on top of either
CONFIGS = {"default": ["config/config.yaml"], "paper": ["config/paper.yaml"]}
CPT_OVERLAY = {"default": "config/cpt.yaml", "paper": "config/cpt_paper.yaml"}
# the one lint kind left on purpose (justified in the Snakefile's header comment)
ALLOWED_LINTS = {"Specify a conda environment or container for each rule."}

sys.path.insert(0, str(REPO / "workflow" / "scripts"))


def snakemake(args, workdir, env_extra=None, timeout=300):
    """Run snakemake on the repo's Snakefile in `workdir`; returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **(env_extra or {}))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def configfiles(*names):
    return ["--configfile", *[str(REPO / n) for n in names]]


def job_counts(out: str) -> dict:
    """The 'Job stats' table of a (dry) run: rule -> number of jobs."""
    m = re.search(r"Job stats:\njob\s+count\n[- ]+\n(.*?)\ntotal\s+(\d+)", out, re.S)
    assert m, f"no job stats in output:\n{out[-3000:]}"
    counts = {}
    for line in m.group(1).splitlines():
        rule, n = line.split()
        counts[rule] = int(n)
    return counts


def load(name):
    return yaml.safe_load((REPO / name).read_text())


def n_runs(labels, sizes, seeds):
    return len(labels) * len(sizes) * len(seeds)


def expected_train_jobs(cfg, target):
    """Training runs a target needs, counted from the config file (independently of the workflow)."""
    t1 = {(v, s, k) for v in cfg["table1"]["variants"] for s in cfg["sizes"] for k in cfg["seeds"]}
    h = cfg["heads"]
    heads = {(v, s, k) for v in h["variants"] for s in h["sizes"] for k in h["seeds"]}
    d = cfg["downstream"]
    ds = {(v, s, k) for v in d["variants"] for s in d["sizes"] for k in d["seeds"]}
    return {"reproduce_table1": t1, "reproduce_seeds": t1, "reproduce_heads": heads,
            "reproduce_downstream": ds, "all": t1 | heads | ds, "report": t1 | heads | ds}.get(target, set())


# --- dry runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_dry_run(target, config_name, tmp_path):
    files = CONFIGS[config_name] + ([CPT_OVERLAY[config_name]] if target == "reproduce_cpt" else [])
    bench = tmp_path / "results" / "bench"  # stands for the committed GPU records of the cost table
    bench.mkdir(parents=True)
    (bench / "training.csv").write_text("size,provider,tokens_per_s\n")  # cost.bench_files lists it
    res = snakemake([target, "-n", *configfiles(*files)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout + res.stderr
    counts = job_counts(out)
    cfg = load(CONFIGS[config_name][0])
    runs = expected_train_jobs(cfg, target)
    assert counts.get("train", 0) == len(runs), counts
    # one tokenization job per size (a size's runs share its results hash and data)
    assert counts.get("prepare_data", 0) == len({size for _, size, _ in runs})
    if target == "reproduce_downstream":
        d = cfg["downstream"]
        n_tasks, n_eval = len(d["tasks"]), n_runs(d["variants"], d["sizes"], d["seeds"])
        assert counts["evaluate"] == n_eval * n_tasks
        # one paired comparison per task and non-baseline run (baseline is one of the variants)
        assert counts["paired_stats"] == n_runs([v for v in d["variants"] if v != "baseline"], d["sizes"],
                                                d["seeds"]) * n_tasks
    if target == "reproduce_cpt":
        assert counts["cpt_table"] == 1 and counts["cpt_train"] == 2
    if target == "reproduce_cost":
        assert counts["table_cost"] == 1
        assert counts.get("bench_throughput", 0) == int(cfg["cost"]["run_benchmark"])
    if config_name == "paper" and counts.get("train"):
        gpus = cfg["resources"]["gpus_per_run"]
        train_jobs = re.findall(r"rule train:.*?resources: ([^\n]*)", out, re.S)
        assert train_jobs and all(f"gpu={gpus}" in r and f"nvidia_gpu={gpus}" in r for r in train_jobs)


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_cpt_target_without_cpt_block_says_what_to_add(config_name, tmp_path):
    res = snakemake(["reproduce_cpt", "-n", *configfiles(*CONFIGS[config_name])], tmp_path)
    assert res.returncode != 0
    assert CPT_OVERLAY[config_name] in res.stdout + res.stderr


def test_invalid_config_names_the_field(tmp_path):
    cfg = load("config/ci.yaml")
    cfg["seeds"] = [0, "one"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(bad)], tmp_path)
    assert res.returncode != 0
    assert "seeds" in res.stderr + res.stdout and "'one' is not of type 'integer'" in res.stderr + res.stdout

    cfg = load("config/ci.yaml")
    cfg["train"]["train"]["lr_typo"] = 1.0  # caught by mhar.runconfig when the hash is computed
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(bad)], tmp_path)
    assert res.returncode != 0 and "train.lr_typo" in res.stderr + res.stdout


def test_lint_only_justified_warnings(tmp_path):
    res = snakemake(["--lint", *configfiles("config/config.yaml", "config/cpt.yaml")], tmp_path)
    kinds = set(re.findall(r"^\s+\* (.+?):?$", res.stdout + res.stderr, re.M))
    assert kinds, "lint printed nothing: the output format changed?"
    assert kinds <= ALLOWED_LINTS, kinds - ALLOWED_LINTS
    # each remaining kind is justified in the Snakefile's header comment
    header = " ".join(line.lstrip("# ") for line in (REPO / "Snakefile").read_text().splitlines())
    assert all(kind.rstrip(".") in header for kind in kinds)


def test_snakefmt_formatting():
    pytest.importorskip("snakefmt")
    res = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_multi_gpu_runs_launch_torchrun():
    from _glue import launcher

    assert launcher(0) == [sys.executable] and launcher(1) == [sys.executable]
    assert launcher(8) == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"]


# --- CI-sized end to end ---------------------------------------------------------------------------
@pytest.mark.slow
def test_ci_end_to_end(tmp_path):
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    ci = configfiles("config/ci.yaml")
    cfg = load("config/ci.yaml")

    res = snakemake(["all", "--cores", "2", *ci], tmp_path, env, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    reports = tmp_path / "reports"
    for name in ("table1.md", "table1.csv", "seeds.md", "heads.md", "downstream.md", "REPORT.md",
                 "figures/loss_curves.png", "figures/loss_curves.pdf"):
        assert (reports / name).is_file(), name

    # the table's numbers are the runs' numbers: mean tail-mean val loss over seeds, per variant
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("results/runs/*/*/*/seed*/summary.json")]
    assert len(summaries) == n_runs(cfg["table1"]["variants"], cfg["sizes"], cfg["seeds"])
    rows = list(csv.DictReader((reports / "table1.csv").open()))
    assert {r["variant"] for r in rows} == {cfg["variants"][v]["variant"] for v in cfg["table1"]["variants"]}
    for r in rows:
        losses = [s["tail_mean_val_loss"] for s in summaries if s["variant"] == r["variant"]]
        assert float(r["loss_mean"]) == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    stats = list(tmp_path.glob("results/stats/**/vs_baseline.json"))
    assert len(stats) == len(cfg["downstream"]["tasks"])
    assert json.loads(stats[0].read_text())["comparison"]["result"]["n"] > 0

    res = snakemake(["all", "--cores", "2", *ci], tmp_path, env)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr

    # adding a seed trains only the new runs (one per Table 1 variant), in the same hash dir
    hashes = {p.name for p in (tmp_path / "results/runs").iterdir()}
    overlay = tmp_path / "more_seeds.yaml"
    overlay.write_text(yaml.safe_dump({"seeds": cfg["seeds"] + [max(cfg["seeds"]) + 1]}))
    res = snakemake(["reproduce_table1", "-n", *configfiles("config/ci.yaml"), str(overlay)], tmp_path, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert job_counts(res.stdout + res.stderr)["train"] == len(cfg["table1"]["variants"])
    new_runs = re.findall(r"output: results/runs/(\w+)/[^,\s]+?/seed(\d+)/", res.stdout)
    assert new_runs and all(h in hashes and int(k) == max(cfg["seeds"]) + 1 for h, k in new_runs)

    # a changed hyper-parameter is a new results hash: every run again, nothing overwritten
    overlay.write_text(yaml.safe_dump({"train": {"train": {"lr": cfg["train"]["train"]["lr"] / 2}}}))
    res = snakemake(["reproduce_table1", "-n", *configfiles("config/ci.yaml"), str(overlay)], tmp_path, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert job_counts(res.stdout + res.stderr)["train"] == len(summaries)
    changed = set(re.findall(r"output: results/runs/(\w+)/", res.stdout))
    assert changed and not changed & hashes
