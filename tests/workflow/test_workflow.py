"""The Snakemake workflow (Snakefile, workflow/, config/, profiles/).

* dry runs of every target with the default and the paper configs (no data, no GPU needed),
  with job counts checked against the config files themselves;
* Snakemake's conventions: a `--configfile` overlay applies on top of the defaults, `--config` values
  are YAML, each config has its own reports folder, every compute rule has `benchmark:`, tables /
  figures / REPORT.md are `report()` outputs (the `--report` HTML carries them); an unknown task name
  stops the dry run with one `error:` line;
* `snakemake --lint` is clean; every rule names a conda env that covers its dependencies;
* the CI-sized end-to-end run (config/ci.yaml) into a temporary directory, then: nothing in reports/,
  benchmarks and lm-eval's files present, the HTML report, a second invocation has nothing to do, an
  added seed trains only the new runs, and a changed hyper-parameter trains into a new results hash.

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

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("reproduce_table1", "reproduce_downstream", "reproduce_heads", "reproduce_seeds",
           "reproduce_cpt", "reproduce_cost", "report", "all")
# config name -> config files; the CPT arm is an overlay (config/cpt*.yaml) on top of either
CONFIGS = {"default": ["config/config.yaml"], "paper": ["config/paper.yaml"]}
CPT_OVERLAY = {"default": "config/cpt.yaml", "paper": "config/cpt_paper.yaml"}

sys.path.insert(0, str(REPO / "workflow" / "scripts"))


def snakemake(args, workdir, env_extra=None, timeout=300, cwd=None):
    """Run snakemake on the repo's Snakefile in `workdir` (started from `cwd`: relative paths in `args` are read
    there); returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **(env_extra or {}))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


def bench_standins(workdir):
    """Stand-ins for the committed GPU records of the cost table (cost.bench_files lists them)."""
    bench = workdir / "results" / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / "training.csv").write_text("size,provider,tokens_per_s\n")
    (bench / "inference.csv").write_text("size,variant,routing_impl,prefill_tok_s,decode_ms_per_token,peak_mem_gib\n")


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


def data_of(cfg, size):
    """What a size's tokenization depends on, read from the config file: its data section (size_overrides
    applied; not the data-order seed, not locations) and the model's vocabulary size."""
    from mhar.model.presets import PRESETS

    over = (cfg.get("size_overrides") or {}).get(size) or {}
    data = {**(cfg["train"].get("data") or {}), **(over.get("data") or {})}
    preset = PRESETS[size].model if size in PRESETS else {}
    model = {**preset, **(cfg["train"].get("model") or {}), **(over.get("model") or {})}
    return json.dumps({k: v for k, v in data.items() if k not in ("seed", "cache_dir", "data_dir")}, sort_keys=True), \
        model.get("vocab_size")


# --- dry runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_dry_run(target, config_name, tmp_path):
    files = CONFIGS[config_name] + ([CPT_OVERLAY[config_name]] if target == "reproduce_cpt" else [])
    bench_standins(tmp_path)
    res = snakemake([target, "-n", *configfiles(*files)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout + res.stderr
    counts = job_counts(out)
    cfg = load(CONFIGS[config_name][0])
    runs = expected_train_jobs(cfg, target)
    assert counts.get("train", 0) == len(runs), counts
    # one tokenization job per data key (mhar.runs.layout.data_key): the sizes' data sections and vocabularies
    assert counts.get("prepare_data", 0) == len({data_of(cfg, size) for _, size, _ in runs})
    if target == "reproduce_downstream":
        d = cfg["downstream"]
        n_tasks, n_eval = len(d["tasks"]), n_runs(d["variants"], d["sizes"], d["seeds"])
        assert counts["evaluate"] == n_eval * n_tasks
        # the table reads the samples itself: one code path per reported number (no paired_stats step)
        assert "paired_stats" not in counts and counts["table"] == 1
        assert any(f.endswith("/downstream.md") for f in planned_outputs(out, "table"))
    if target == "reproduce_cpt":
        assert counts["cpt_table"] == 1 and counts["cpt_train"] == 2
    if target == "reproduce_cost":
        assert counts["table"] == 1 and any(f.endswith("/cost.md") for f in planned_outputs(out, "table"))
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


def test_released_target_without_released_arms_says_what_to_add(tmp_path):
    res = snakemake(["reproduce_released", "-n", *configfiles("config/ci.yaml")], tmp_path)
    assert res.returncode != 0
    assert "config/released.yaml" in res.stdout + res.stderr


def test_invalid_config_names_the_field(tmp_path):
    cfg = load("config/ci.yaml")
    cfg["seeds"] = [0, "one"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(bad)], tmp_path)
    assert res.returncode != 0
    assert "seeds" in res.stderr + res.stdout and "'one' is not of type 'integer'" in res.stderr + res.stdout

    cfg = load("config/ci.yaml")
    cfg["train"]["train"]["lr_typo"] = 1.0  # caught by mhar.runs.config when the hash is computed
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(bad)], tmp_path)
    assert res.returncode != 0 and "train.lr_typo" in res.stderr + res.stdout


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_lint_clean(config_name, tmp_path):
    res = snakemake(["--lint", *configfiles(*CONFIGS[config_name], CPT_OVERLAY[config_name])], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert not re.findall(r"^\s+\* (.+?):?$", out, re.M), out[-3000:]


def rule_envs() -> dict:
    """rule name -> the conda env file its `conda:` directive names (resolved; None without one)."""
    envs = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^(?=rule |checkpoint )", smk.read_text(), flags=re.M)[1:]:
            name = re.match(r"(?:rule|checkpoint) (\w+):", block).group(1)
            m = re.search(r"^    conda:\n\s+\"([^\"]+)\"", block, re.M)
            envs[name] = (smk.parent / m.group(1)).resolve() if m else None
    return envs


def env_packages(path: Path) -> set:
    """Distribution names an env file installs (conda and pip entries, versions dropped)."""
    names = set()
    for dep in yaml.safe_load(path.read_text())["dependencies"]:
        for d in (dep["pip"] if isinstance(dep, dict) else [dep]):
            names.add(re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_every_rule_has_an_env_covering_its_dependencies():
    envs = rule_envs()
    n_rules = sum(len(re.findall(r"^(?:rule|checkpoint) \w+:", smk.read_text(), flags=re.M))
                  for smk in (REPO / "workflow" / "rules").glob("*.smk"))
    assert n_rules >= 19 and len(envs) == n_rules  # every rule of the workflow names an env
    assert all(p is not None and p.parent == REPO / "workflow" / "envs" and p.is_file() for p in envs.values()), envs
    import tomllib

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = proj["optional-dependencies"]

    def names(reqs):
        return {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() for r in reqs if not r.startswith("mhar[")}

    core = names(proj["dependencies"])
    need = {"train": core | names(extras["data"]) | names(extras["kernels"]), "eval": core | names(extras["eval"]),
            "analysis": names(extras["stats"]) | {"pyyaml"}}
    for env, want in need.items():
        have = env_packages(REPO / "workflow" / "envs" / f"{env}.yaml")
        assert want <= have, f"workflow/envs/{env}.yaml lacks {sorted(want - have)} (pyproject.toml)"
    assert "torch" not in env_packages(REPO / "workflow" / "envs" / "analysis.yaml")


def test_analysis_rules_run_without_torch():
    """The rules on workflow/envs/analysis.yaml (no torch) import only what that env has."""
    scripts = set()
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^(?=rule |checkpoint )", smk.read_text(), flags=re.M)[1:]:
            if "../envs/analysis.yaml" in block:
                scripts.add(re.search(r"^    script:\n\s+\"([^\"]+)\"", block, re.M).group(1))
    assert {"../scripts/table.py", "../scripts/report.py", "../scripts/cpt_table.py"} <= scripts
    mods = set()
    for script in scripts:
        tree = __import__("ast").parse((REPO / "workflow" / "rules" / script).read_text())
        mods |= {n.module for n in __import__("ast").walk(tree) if getattr(n, "module", None)
                 and n.module.split(".")[0] in ("eval", "analysis", "mhar")}
    code = ("import sys\n"
            "class Block:  # any import of a package the analysis env lacks fails\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'lm_eval', 'transformers', 'datasets', 'tokenizers', 'triton'):\n"
            "            raise ImportError(f'{name} is not in workflow/envs/analysis.yaml')\n"
            "sys.meta_path.insert(0, Block())\n" + "".join(f"import {m}\n" for m in sorted(mods)))
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'workflow' / 'scripts'}"})
    assert res.returncode == 0, f"{sorted(mods)}: {res.stderr[-2000:]}"


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
    reports = tmp_path / cfg["reports_dir"]
    for name in ("table1.md", "table1.csv", "seeds.md", "heads.md", "downstream.md", "REPORT.md",
                 "figures/loss_curves.png", "figures/loss_curves.pdf"):
        assert (reports / name).is_file(), name
    # a CI run never writes the committed reports/ (run in the repository, `git status reports/` stays clean)
    assert cfg["reports_dir"].startswith("results/") and not (tmp_path / "reports").exists()
    # Snakemake's benchmark: records of every job that ran, under the results dir
    bench = tmp_path / "results" / "benchmarks"
    n_train = n_runs(cfg["table1"]["variants"], cfg["sizes"], cfg["seeds"])
    assert len(list(bench.glob("train/**/*.tsv"))) == n_train
    d = cfg["downstream"]
    n_eval = n_runs(d["variants"], d["sizes"], d["seeds"]) * len(d["tasks"])
    assert len(list(bench.glob("eval/**/*.tsv"))) == n_eval
    # the report-stage jobs' records: one folder per config (its results hash)
    assert all(len(list((bench / "reports").glob(f"*/{n}.tsv"))) == 1 for n in ("table1", "downstream", "report"))
    assert "s\th:m:s\tmax_rss" in next(bench.glob("train/**/*.tsv")).read_text()
    # every evaluation wrote lm-eval's own files beside what the statistics read
    for res_json in tmp_path.glob("results/eval/**/results.json"):
        rec = json.loads(res_json.read_text())
        lm = json.loads((res_json.parent / rec["lm_eval_files"]["results"]).read_text())
        assert lm["n-samples"][rec["task"]]["effective"] == rec["n"] and lm["config"]["model"] == "mhar"
        assert len((res_json.parent / rec["lm_eval_files"]["samples"]).read_text().splitlines()) == rec["n"]
    assert len(list(tmp_path.glob("results/eval/**/results.json"))) == n_eval
    # `snakemake --report`: one HTML with the tables, figures and REPORT.md of this run
    res = snakemake(["--report", "report.html", *ci], tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    html = (tmp_path / "report.html").read_text(errors="replace")
    assert all(n in html for n in ("table1.md", "downstream.csv", "loss_curves.png", "REPORT.md"))

    # the table's numbers are the runs' numbers: mean tail-mean val loss over seeds, per variant
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("results/runs/*/*/seed*/*/summary.json")]
    assert len(summaries) == n_runs(cfg["table1"]["variants"], cfg["sizes"], cfg["seeds"])
    rows = list(csv.DictReader((reports / "table1.csv").open()))
    assert {r["variant"] for r in rows} == {cfg["variants"][v]["variant"] for v in cfg["table1"]["variants"]}
    for r in rows:
        losses = [s["tail_mean_val_loss"] for s in summaries if s["variant"] == r["variant"]]
        assert float(r["loss_mean"]) == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    # the downstream table does its paired tests from the samples (no separate paired-stats files)
    ds = list(csv.DictReader((reports / "downstream.csv").open()))
    assert {r["task"] for r in ds} == set(cfg["downstream"]["tasks"])
    assert all(int(r["n"]) > 0 and r["test"] for r in ds) and not (tmp_path / "results/stats").exists()

    res = snakemake(["all", "--cores", "2", *ci], tmp_path, env)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr

    # the runs listing (written by the train jobs) names every run folder, finished
    index = (tmp_path / "results/runs/INDEX.md").read_text()
    assert index.count("| finished |") == len(summaries) and "incomplete" not in index.split("|---", 1)[1]

    # adding a seed trains only the new runs (one per Table 1 variant), beside the others
    runs = {p.parent.relative_to(tmp_path).as_posix() for p in tmp_path.glob("results/runs/*/*/seed*/*/summary.json")}
    overlay = tmp_path / "more_seeds.yaml"
    overlay.write_text(yaml.safe_dump({"seeds": cfg["seeds"] + [max(cfg["seeds"]) + 1]}))
    res = snakemake(["reproduce_table1", "-n", *configfiles("config/ci.yaml"), str(overlay)], tmp_path, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert job_counts(res.stdout + res.stderr)["train"] == len(cfg["table1"]["variants"])
    new_runs = re.findall(r"output: (results/runs/(\w+)/\w+/seed(\d+)/[0-9a-f]+)/", res.stdout)
    assert new_runs and all(label in cfg["table1"]["variants"] and int(k) == max(cfg["seeds"]) + 1
                            and d not in runs for d, label, k in new_runs)

    # a changed hyper-parameter is a new run identity: every run again, into new folders, nothing overwritten
    overlay.write_text(yaml.safe_dump({"train": {"train": {"lr": cfg["train"]["train"]["lr"] / 2}}}))
    res = snakemake(["reproduce_table1", "-n", *configfiles("config/ci.yaml"), str(overlay)], tmp_path, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert job_counts(res.stdout + res.stderr)["train"] == len(summaries)
    changed = set(re.findall(r"output: (results/runs/\w+/\w+/seed\d+/[0-9a-f]+)/", res.stdout))
    assert len(changed) == len(summaries) and not changed & runs


# --- config overlays, --config as YAML, reports folders, task names (dry runs) ----------------------
def planned_outputs(out: str, rule: str) -> list[str]:
    """The output files of every planned job of `rule` in a dry run's listing."""
    return [f for m in re.finditer(rf"^rule {rule}:\n((?:    .*\n)+)", out, re.M)
            for line in re.findall(r"^    output: (.*)$", m.group(1), re.M) for f in line.split(", ")]


def planned_field(out: str, rule: str, field: str) -> list[str]:
    """The `field` (log, benchmark) of every planned job of `rule` in a dry run's listing."""
    return [f for m in re.finditer(rf"^rule {rule}:\n((?:    .*\n)+)", out, re.M)
            for line in re.findall(rf"^    {field}: (.*)$", m.group(1), re.M) for f in line.split(", ")]


REPORT_RULES = ("table", "figure", "probe", "report")  # one table rule for every registry table


def test_report_jobs_log_per_config(tmp_path):
    """results/logs/reports/table1.log was shared between configs (an overlay's table job overwrote the
    defaults' log): the report-stage jobs log, and record their benchmark, under the config's results hash,
    the hash that names an overlay's reports folder."""
    bench_standins(tmp_path)
    overlay = tmp_path / "my_seeds.yaml"
    overlay.write_text("seeds: [0, 5]\n")
    outs = {}
    for name, extra in (("default", []), ("overlay", ["--configfile", str(overlay)])):
        res = snakemake(["all", "-n", *extra], tmp_path)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        outs[name] = res.stdout + res.stderr
    for field, root in (("log", "results/logs/reports/"), ("benchmark", "results/benchmarks/reports/")):
        paths = {name: {rule: planned_field(out, rule, field) for rule in REPORT_RULES} for name, out in outs.items()}
        for rule in REPORT_RULES:
            assert paths["default"][rule] and paths["overlay"][rule], (rule, field)
            assert not set(paths["default"][rule]) & set(paths["overlay"][rule]), (rule, field)
        folders = {name: {f[len(root):].split("/")[0] for rule in REPORT_RULES for f in paths[name][rule]
                          if f.startswith(root)} for name in paths}
        assert all(len(f) == 1 for f in folders.values()), folders  # every report job of a config: one folder
        reports = next(f for f in planned_outputs(outs["overlay"], "table") if f.endswith("/table1.md")).split("/")  # results/reports/<hash>/table1.md
        assert folders["overlay"] == {reports[2]}, (folders, reports)


def test_seeds_overlay_applies_on_top_of_the_defaults(tmp_path):
    """`--configfile my_seeds.yaml` (one line) is an overlay on config/config.yaml: with the default runs
    finished, it plans only the new seed's training runs (and writes its tables outside reports/)."""
    res = snakemake(["reproduce_table1", "-n", "--until", "train"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    default = res.stdout + res.stderr
    cfg = load("config/config.yaml")
    finished = planned_outputs(default, "prepare_data") + planned_outputs(default, "train")
    assert len(planned_outputs(default, "train")) == 3 * len(cfg["table1"]["variants"]) * len(cfg["seeds"])
    for rel in finished:  # stand-ins for the finished default runs (data first: inputs older than outputs)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    overlay = tmp_path / "my_seeds.yaml"
    overlay.write_text("seeds: [0, 1, 2, 3]\n")
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(overlay)], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    trains = planned_outputs(out, "train")
    assert len(trains) == 3 * len(cfg["table1"]["variants"])  # summary, metrics, model of each new run
    assert all("/seed3/" in f for f in trains)
    assert "prepare_data" not in job_counts(out)
    # the committed reports/ belong to config/config.yaml: the overlay's tables go to results/reports/<hash>
    tables = [f for f in planned_outputs(out, "table") if "/table1." in f]
    assert tables and all(re.fullmatch(r"results/reports/[0-9a-f]{8}/table1\.(md|csv|tex)", f) for f in tables)


def test_config_values_are_yaml(tmp_path):
    """`--config seeds=[0]` and `--config 'stats={resamples: N}'` arrive as numbers (Snakemake 9 alone gives
    the items as strings, which the schema refuses)."""
    ci = configfiles("config/ci.yaml")
    res = snakemake(["reproduce_table1", "-n", *ci, "--config", "seeds=[0]", "stats={resamples: 999}"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert job_counts(out)["train"] == len(load("config/ci.yaml")["table1"]["variants"])
    assert all("/seed0/" in f for f in planned_outputs(out, "train"))
    res = snakemake(["reproduce_table1", "-n", *ci, "--config", "stats={resamples: 98}"], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "98 is less than the minimum of 99" in out  # a number, checked as one
    res = snakemake(["reproduce_table1", "-n", *ci, "--config", "seeds=[0, 1"], tmp_path)
    errors = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1 and "--config seeds=[0, 1" in errors[0]


@pytest.mark.parametrize("name,reports", [("config/ci.yaml", "results/ci/reports"),
                                          ("config/gpu_small.yaml", "reports/gpu_small"),
                                          ("config/paper.yaml", "reports/paper")])
def test_each_config_writes_its_own_reports_folder(name, reports, tmp_path):
    bench_standins(tmp_path)
    res = snakemake(["report", "-n", *configfiles(name)], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    written = [f for rule in ("report", "table", "figure") for f in planned_outputs(out, rule)]
    assert f"{reports}/REPORT.md" in written and all(f.startswith(reports + "/") for f in written)


def test_report_reads_its_own_configs_probe_files(tmp_path):
    """analysis.report reads only the report rule's inputs: they name this config's probe JSONs (the report once
    globbed reports/ and listed reports/gpu_small/probe/ rows under config/config.yaml)."""
    bench_standins(tmp_path)
    res = snakemake(["report", "-n", *configfiles("config/config.yaml")], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    m = re.search(r"^rule report:\n((?:    .*\n)+)", out, re.M)
    inputs = re.search(r"^    input: (.*)$", m.group(1), re.M).group(1).split(", ")
    cfg = load("config/config.yaml")
    assert {f"reports/probe/{s}/mhar.json" for s in cfg["sizes"]} <= set(inputs)
    assert "reports/table1.csv" in inputs and "reports/figures/forest.png" in inputs
    assert not [f for f in inputs if f.startswith("reports/gpu_small/")]


def test_unknown_config_key_is_one_error_line(tmp_path):
    """An unknown --config key (a typo) gave an 8-line WorkflowError trace; now one `error:` line naming it."""
    res = snakemake(["reproduce_table1", "-n", "--config", "seeds=[0]", "sedes=[1]"], tmp_path)
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, out[-2000:]
    assert "at sedes: unknown key 'sedes'; allowed: " in errors[0] and "config/schema.yaml" in errors[0]
    assert "seeds" in errors[0].split("allowed: ")[1]
    assert "Traceback" not in out and "WorkflowError" not in out and "File \"" not in out


def _one_error_line(res):
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, out[-2000:]
    assert "Traceback" not in out and "WorkflowError" not in out and "File \"" not in out, out[-2000:]
    return errors[0]


def test_nested_unknown_key_is_one_error_line(tmp_path):
    """A typo nested in a block (the run config under train:, a variant's residual, a size override, a schema
    block) gave a 13-line WorkflowError trace; now one `error:` line with the key path as the workflow config
    spells it and the keys allowed there, from --config and from a --configfile overlay alike."""
    line = _one_error_line(snakemake(["reproduce_table1", "-n", "--config", "train={train: {lrr: 0.1}}"], tmp_path))
    assert "unknown config key(s) train.train.lrr; valid keys of train.train: " in line
    assert "lr" in line.split("valid keys of train.train: ")[1].split(", ")
    overlay = tmp_path / "mine.yaml"
    overlay.write_text("train:\n  train:\n    lrr: 0.1\n")
    line = _one_error_line(snakemake(["reproduce_table1", "-n", "--configfile", str(overlay)], tmp_path))
    assert "unknown config key(s) train.train.lrr" in line
    overlay.write_text("variants:\n  mhar:\n    variant: mhar\n    hedas: 4\n")
    line = _one_error_line(snakemake(["reproduce_table1", "-n", "--configfile", str(overlay)], tmp_path))
    assert "unknown config key(s) variants.mhar.hedas; valid keys of variants.mhar: " in line and "heads" in line
    line = _one_error_line(snakemake(["reproduce_table1", "-n", "--config",
                                      "size_overrides={tiny: {data: {seq_lenn: 64}}}"], tmp_path))
    assert "unknown config key(s) size_overrides.tiny.data.seq_lenn" in line and "seq_len" in line
    line = _one_error_line(snakemake(["reproduce_table1", "-n", "--config", "stats={resamplez: 999}"], tmp_path))
    assert "at stats.resamplez: unknown key 'resamplez'; allowed: resamples" in line


def test_overlay_says_where_its_reports_went_at_the_end(tmp_path):
    """A user who adds seeds with an overlay finds its tables under results/reports/<hash>/, not in reports/:
    the last line of a successful run says so (the cost table is the cheapest real job of an overlay)."""
    bench_standins(tmp_path)
    overlay = tmp_path / "my_seeds.yaml"
    overlay.write_text("seeds: [0, 5]\n")
    res = snakemake(["reproduce_cost", "--cores", "1", "--configfile", str(overlay)], tmp_path)
    err = res.stderr.strip().splitlines()
    assert res.returncode == 0, res.stderr[-3000:]
    said = [ln for ln in err if ln.startswith("reports of this config: results/reports/")]
    assert said and err.index(said[-1]) > max(i for i, ln in enumerate(err) if "steps (100%) done" in ln)
    folder = tmp_path / said[-1].split()[4]
    assert (folder / "cost.md").is_file() and not (tmp_path / "reports").exists()


def test_unknown_task_stops_the_dry_run_in_one_line(tmp_path):
    ci = configfiles("config/ci.yaml")
    res = snakemake(["reproduce_downstream", "-n", *ci, "--config", "downstream={tasks: [lambada_openai, hellaswg]}"],
                    tmp_path)
    lines = (res.stdout + res.stderr).strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, lines[-20:]
    assert "downstream.tasks: unknown task 'hellaswg'" in errors[0] and "hellaswag" in errors[0]
    assert "Job stats" not in res.stdout + res.stderr and not (tmp_path / "results").exists()  # nothing planned
    # a task of the user's own folder (any file name) is known through tasks_dir
    mine = tmp_path / "my_tasks"
    mine.mkdir()
    (mine / "anything.yaml").write_text("task: hellaswg\ndataset_path: json\noutput_type: loglikelihood\n"
                                        "test_split: test\ndoc_to_text: '{{text}}'\ndoc_to_target: ' x'\n")
    res = snakemake(["reproduce_downstream", "-n", *ci, "--config", "downstream={tasks: [lambada_openai, hellaswg]}",
                     f"tasks_dir={mine}"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert job_counts(res.stdout + res.stderr)["evaluate"] == 2 * 2  # 2 variants x 2 tasks (seed 0)


def test_compute_rules_have_benchmarks_and_outputs_are_report_items():
    """Snakemake's conventions: every rule that runs something records a `benchmark:` under the results
    dir; tables, figures and REPORT.md are report() outputs with a category and a caption file."""
    n = 0
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^(?=rule |checkpoint )", smk.read_text(), flags=re.M)[1:]:
            name = re.match(r"(?:rule|checkpoint) (\w+):", block).group(1)
            if not re.search(r"^    (script|shell|run|wrapper):", block, re.M):
                continue
            n += 1
            m = re.search(r"^    benchmark:\n\s+f\"\{(CPT_)?BENCHMARKS\}/([^\"]+)\.tsv\"", block, re.M)
            assert m, f"rule {name} ({smk.name}) has no benchmark: under BENCHMARKS"
            if name in ("table", "cpt_table"):
                assert "table_report(" in block, name
            if name in ("figure", "report"):
                rep = re.search(r"report\(\n(.*?)\n        \)", block, re.S)
                assert rep and "category=" in rep.group(1) and "caption=" in rep.group(1), name
                cap = re.search(r'caption="([^"]+)"', rep.group(1)).group(1)
                assert (smk.parent / cap).is_file()
    assert n >= 18  # one table rule for every registry table the workflow lists (tables.smk), cpt_table
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert 'BENCHMARKS = f"{RESULTS}/benchmarks"' in common
    assert (REPO / "workflow" / "report" / "table.rst").is_file()


def _png() -> bytes:
    import base64

    return base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def test_html_report_of_the_default_config_carries_tables_figures_and_report(tmp_path):
    """`snakemake --report report.html` (default config) on a prepared results dir: every output present
    (stand-ins), the HTML embeds table1, every figure and REPORT.md."""
    bench_standins(tmp_path)
    res = snakemake(["all", "-n"], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    outputs = {f for rule in set(re.findall(r"^rule (\w+):", out, re.M)) for f in planned_outputs(out, rule)}
    figures = sorted(f for f in outputs if f.startswith("reports/figures/"))
    assert {"reports/table1.md", "reports/REPORT.md", "reports/figures/loss_curves.png"} <= outputs
    for rel in sorted(outputs):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_png() if rel.endswith(".png") else f"stand-in {rel}\n".encode())
    (tmp_path / "reports" / "REPORT.md").write_text("# REPORT-MARKER-7f3a\n")
    res = snakemake(["--report", "report.html"], tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    html = (tmp_path / "report.html").read_text(errors="replace")
    for name in ["table1.md", "table1.csv", "REPORT.md", *[Path(f).name for f in figures]]:
        assert name in html, name
    assert len(figures) >= 8  # loss_curves, loss_vs_compute, head_sweep, forest, cost, routing_heatmap (png + pdf)
    import base64

    assert "REPORT-MARKER-7f3a" in html or base64.b64encode(b"# REPORT-MARKER-7f3a\n").decode() in html


def _tree_bytes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_undefined_baseline_label_fails_the_dry_run(tmp_path):
    cfg = load("config/ci.yaml")
    cfg["table1"]["baseline"] = "basline"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(bad)], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "table1.baseline 'basline'" in out and "latency" not in out
    cfg = load("config/ci.yaml")
    cfg["heads"]["variants"] = ["mhar", "mhar_h16"]
    bad.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_heads", "-n", "--configfile", str(bad)], tmp_path)
    assert res.returncode != 0 and "heads.variants names undefined label(s) 'mhar_h16'" in res.stdout + res.stderr


@pytest.mark.slow
def test_run_identity_paths_keep_finished_runs(tmp_path):
    """A redefined label trains into a new directory (the finished one stays byte-identical);
    knobs that cannot change a result (threads, log cadence) replan nothing."""
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"seeds": [0]}))
    over = tmp_path / "over.yaml"

    def plan(overlay):
        over.write_text(yaml.safe_dump(overlay))
        res = snakemake(["reproduce_table1", "-n", "--until", "train", *configfiles("config/ci.yaml"), str(base),
                         str(over)], tmp_path, env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return re.findall(r"output: (results/runs/mhar/\S+)/summary.json", res.stdout), res.stdout + res.stderr

    (old,), _ = plan({})
    over.write_text("{}\n")
    res = snakemake([f"{old}/summary.json", "--cores", "1", *configfiles("config/ci.yaml"), str(base), str(over)],
                    tmp_path, env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    before = _tree_bytes(tmp_path / old)
    assert json.loads(before["summary.json"])["run"]["residual"]["heads"] == 4

    # execution knobs: the finished run is not replanned (nor its parameters reported changed); the routing
    # implementation is one of them (mhar.runs.config.IDENTITY_EXCLUDE)
    knobs = {"train": {"train": {"threads": 2, "log_every": 1, "checkpoint_every": 4, "micro_batch": 2,
                                 "compile": False}},
             "variants": {"mhar": {"variant": "mhar", "heads": 4, "routing_impl": "compile"}}}
    runs, out = plan(knobs)
    assert old not in runs
    # (--summary, not --list-changes params: the latter lists every job's last output in Snakemake 9)
    res = snakemake(["--summary", f"{old}/summary.json", *configfiles("config/ci.yaml"), str(base), str(over)],
                    tmp_path, env)
    rows = [ln.split("\t") for ln in res.stdout.splitlines() if ln.startswith("results/")]
    assert res.returncode == 0 and len(rows) == 4 and all(r[-2:] == ["ok", "no update"] for r in rows), res.stdout
    res = snakemake([f"{old}/summary.json", "-n", *configfiles("config/ci.yaml"), str(base), str(over)], tmp_path, env)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr

    # a redefined label or data seed: new directories; training one leaves the old run untouched
    (reseeded,), _ = plan({"train": {"data": {"seed": 7}}})
    (relabelled,), _ = plan({"variants": {"mhar": {"variant": "mhar", "heads": 2}}})  # stays in over.yaml
    assert len({old, relabelled, reseeded}) == 3
    res = snakemake([f"{relabelled}/summary.json", "--cores", "1", *configfiles("config/ci.yaml"), str(base),
                     str(over)], tmp_path, env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((tmp_path / relabelled / "summary.json").read_text())["run"]["residual"]["heads"] == 2
    assert _tree_bytes(tmp_path / old) == before


def test_variant_labels_resolve_through_the_residual_registry(tmp_path):
    """The schema holds no variant list: a label's variant is checked against mhar.model.residuals' registry, so a
    variant registered by a module outside the package (tests/toy_variant.py) plans like a built-in one, and
    an unknown name fails the dry run listing the registered ones."""
    cfg = load("config/ci.yaml")
    cfg["variants"]["toy"] = {"variant": "toy_gated", "module": "tests.toy_variant"}
    cfg["table1"]["variants"] = ["baseline", "toy"]
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(path)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert job_counts(res.stdout)["train"] == 4 and "/toy/debug/seed1/" in res.stdout
    cfg["variants"]["toy"] = {"variant": "toy_gatd"}
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(["reproduce_table1", "-n", "--configfile", str(path)], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "unknown variant 'toy_gatd'" in out and "mhar_delta" in out


def test_probe_jobs_are_the_registry_routed_variants(tmp_path):
    """The probe (and routing heatmap) covers exactly the Table 1 labels whose variant routes over every
    sublayer output (mhar.model.residuals.routed_variants()): with one label per registered variant, plus a routed
    variant registered outside the package (tests/toy_routed.py), the planned probe jobs are those labels."""
    import tests.toy_routed  # noqa: F401  registers toy_routed here as the workflow does through `module:`
    from mhar.model.residuals import RESIDUALS, routed_variants

    cfg = load("config/ci.yaml")
    cfg["variants"] = {name: {"variant": name} for name, cls in RESIDUALS.items()
                       if cls.__module__.startswith("mhar.model.residuals.")}
    cfg["variants"]["toy_routed"] = {"variant": "toy_routed", "module": "tests.toy_routed"}
    cfg["variants"]["block_attnres"]["blocks"] = 2  # the debug preset: 2 layers, 4 sublayers
    cfg["variants"]["mhar_delta"]["delta_block_layers"] = 1
    cfg["table1"]["variants"] = list(cfg["variants"])
    cfg["heads"]["variants"] = cfg["downstream"]["variants"] = ["baseline"]
    path = tmp_path / "all_variants.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(["report", "-n", "--configfile", str(path)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    probed = {Path(f).stem for f in planned_outputs(res.stdout, "probe")}
    assert {"attnres", "mhar", "toy_routed"} <= probed
    assert probed == set(routed_variants()) & set(cfg["variants"])


def test_published_source_is_a_config_key_checked_at_dag_build(tmp_path):
    ci = configfiles("config/ci.yaml")
    res = snakemake(["reproduce_table1", "-n", *ci, "--config", "published={table1: arxiv-v2-web}"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = snakemake(["reproduce_table1", "-n", *ci, "--config", "published={table1: arxiv-v3-table9}"], tmp_path)
    errors = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, (res.stdout + res.stderr)[-2000:]
    assert "published.table1: unknown published source 'arxiv-v3-table9'" in errors[0] and "arxiv-v2-web" in errors[0]
    assert not (tmp_path / "results").exists()


def test_tracked_runs_are_grouped_by_the_config_hash_and_keep_their_paths(tmp_path):
    """`tracking: [tensorboard]` reaches every training run as train.tracking with the config's results hash
    as its group (the overlay's reports folder name); it is bookkeeping: the same run paths and hash."""
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    over = tmp_path / "over.yaml"

    def plan(overlay):
        over.write_text(yaml.safe_dump(overlay))
        res = snakemake(["reproduce_table1", "-n", "--until", "train", *configfiles("config/ci.yaml"), str(over)],
                        tmp_path, env)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:]
        return (re.findall(r"output: (results/runs/mhar/\S+)/summary.json", out),
                re.search(r"reports of this config \(an overlay on \S+\): results/reports/([0-9a-f]{8})", out)[1])

    runs, study = plan({"seeds": [0]})
    (run,), tracked_study = plan({"seeds": [0], "tracking": ["tensorboard"], "eval_wandb_args": "project=x"})
    assert [run] == runs and tracked_study == study
    res = snakemake([f"{run}/summary.json", "--cores", "1", *configfiles("config/ci.yaml"), str(over)], tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    train = yaml.safe_load((tmp_path / run / "config.yaml").read_text())["train"]
    assert train["tracking"] == ["tensorboard"] and train["tracking_group"] == study
    assert json.loads((tmp_path / run / "tracking.json").read_text())["name"] == "mhar/debug/seed0"
    assert list((tmp_path / run / "tensorboard").glob("events.out.tfevents.*"))
