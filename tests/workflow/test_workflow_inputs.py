"""The workflow's config check (workflow/rules/config.smk + config/schema.yaml) at its new surfaces: labels are
path components checked at config time, an overlay or a --config value that is a YAML bomb is refused before
anything walks it, a task YAML bomb in tasks_dir is refused before lm-eval reads it, and where a job writes
(workflow/scripts/_glue.py) no output can leave results_dir / reports_dir. Each case: one `error:` line, no
traceback, nothing planned or written (dry runs, `-n`)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEM_LIMIT = 3 << 30
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))


def bomb_value(levels: int = 9) -> str:
    items = [f"&a0 [{','.join(['lol'] * 9)}]"] + [f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def snakemake(args, workdir, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=_limit_memory)


def refused(res, workdir) -> str:
    """The single `error:` line of a refused dry run (exit non-zero, no traceback, nothing planned or written)."""
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, out[-3000:]
    assert "Traceback" not in out and "MemoryError" not in out and "Job stats" not in out, out[-3000:]
    assert len(errors[0]) < 600, errors[0][:1000]
    assert not (workdir / "results").exists() and not (workdir.parent / "escape").exists()
    return errors[0]


CI = ["--configfile", str(ROOT / "config" / "ci.yaml")]


@pytest.mark.parametrize("label,why", [
    ("../../../escape", "'../../../escape'"),  # its import wrote model.pt outside results/
    ("a" * 300, "'aaaa"),  # planned, then "file name too long" after training the other arms
    ("a\nb", "'a\\nb'"),
])
def test_released_label_is_a_safe_path_component(tmp_path, label, why):
    work = tmp_path / "work"
    overlay = tmp_path / "released.yaml"
    overlay.write_text(f"released:\n  {label!r}: {{hf: org/name}}\n".replace("'", '"') if "\n" in label
                       else f"released:\n  '{label}': {{hf: org/name}}\n")
    res = snakemake(["reproduce_released", "-n", *CI, "--configfile", str(overlay)], work)
    line = refused(res, work)
    assert "released" in line and why in line and "at most 100 characters" in line


@pytest.mark.parametrize("config", [
    "variants={'x/y': {variant: baseline}}",
    "sizes=[../up]",
    "downstream={tasks: [..]}",
    "table1={variants: [baseline], baseline: " + "b" * 101 + "}",
])
def test_labels_sizes_and_tasks_are_checked_at_config_time(tmp_path, config):
    work = tmp_path / "work"
    line = refused(snakemake(["reproduce_table1", "-n", *CI, "--config", config], work), work)
    assert "is not allowed" in line and "at most 100 characters" in line
    assert config.split("=")[0] in line


def test_cpt_task_names_are_checked_at_config_time(tmp_path):
    work = tmp_path / "work"
    line = refused(snakemake(["reproduce_cpt", "-n", "--config", "cpt={eval: {tasks: [../up]}}"], work), work)
    assert line.startswith("error: cpt.eval.tasks: '../up' is not allowed") and "at most 100 characters" in line


def test_an_overlay_bomb_is_refused_before_the_schema_walks_it(tmp_path):
    """A billion laughs in a --configfile overlay: one line naming the file (before: MemoryError in config.smk)."""
    work = tmp_path / "work"
    overlay = tmp_path / "bomb.yaml"
    overlay.write_text(f"seeds: {bomb_value()}\n")
    line = refused(snakemake(["reproduce_table1", "-n", *CI, "--configfile", str(overlay)], work), work)
    assert str(overlay) in line and "billion laughs" in line


def test_a_config_value_bomb_is_refused(tmp_path):
    work = tmp_path / "work"
    line = refused(snakemake(["reproduce_table1", "-n", *CI, "--config", f"seeds={bomb_value()}"], work), work)
    assert line.startswith("error: --config 'seeds=[&a0 [lol") and "alias *a0" in line and "refused" in line


def test_a_task_yaml_bomb_in_tasks_dir_is_refused_before_lm_eval_reads_it(tmp_path):
    pytest.importorskip("lm_eval")
    work, mine = tmp_path / "work", tmp_path / "my_tasks"
    mine.mkdir()
    (mine / "bomb.yaml").write_text(f"task: boom\ntag: {bomb_value()}\n")
    res = snakemake(["reproduce_downstream", "-n", *CI, "--config", f"tasks_dir={mine}"], work)
    line = refused(res, work)
    assert str(mine / "bomb.yaml") in line and "billion laughs" in line


def _job(tmp_path, output, log, **config):
    return SimpleNamespace(rule="import_released", output=[str(output)], log=[str(log)],
                           config={"results_dir": str(tmp_path / "results"), "reports_dir": str(tmp_path / "reports"),
                                   **config})


def test_no_job_writes_outside_results_or_reports(tmp_path, monkeypatch):
    """The resolved-path check where outputs are written: `..` and links followed, nothing created."""
    from _glue import start

    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    (results / "released").mkdir(parents=True)
    log = results / "logs" / "import.log"
    for out in (results / "released" / ".." / ".." / "escape" / "model.pt", tmp_path / "escape" / "model.pt"):
        with pytest.raises(SystemExit, match=r"^error: rule import_released: output .* outside results_dir"):
            start(_job(tmp_path, out, log))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (results / "released" / "link").symlink_to(outside)  # a link out of the results folder
    with pytest.raises(SystemExit, match="outside results_dir"):
        start(_job(tmp_path, results / "released" / "link" / "model.pt", log))
    with pytest.raises(SystemExit, match="outside results_dir"):  # the log too
        start(_job(tmp_path, results / "released" / "a" / "model.pt", tmp_path / "escape.log"))
    assert not log.exists() and not (tmp_path / "escape").exists() and not (tmp_path / "escape.log").exists()
    start(_job(tmp_path, results / "released" / "a" / "model.pt", log))  # inside: the job starts
    assert log.is_file()
    start(_job(tmp_path, tmp_path / "reports" / "table1.md", log))
