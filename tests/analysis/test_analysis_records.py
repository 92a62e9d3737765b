"""The analysis reads facts from their one home: published numbers by source (analysis/published.csv +
analysis/published_sources.csv, the config's `published` block), sizes from the preset record, a task's primary
metric from its task YAML's `metadata:`, a variant's display from the residual registry."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import fixtures_analysis as fx
from analysis.load.common import AnalysisInputError
from analysis.load.published import load_published, load_sources, paper_scale, published_value
from analysis.tables.build import main as tables_main, make_table
from analysis.tables.downstream import downstream_table
from analysis.tables.registry import TABLES, default_sources
from mhar.model.presets import PRESETS, Preset, register_preset

ROOT = Path(__file__).resolve().parents[2]


# --- published numbers by source --------------------------------------------------------------------
def test_every_published_number_names_a_described_source():
    pub, src = load_published(), load_sources()
    assert set(pub["source"]) <= set(src.index)
    for sid, row in src.iterrows():
        assert row["title"] and row["table"], sid
        if row["kind"] == "repository":  # a repository file is quoted at a commit
            assert row["repository"] and row["file"] and len(row["commit"]) == 40, sid
        else:
            assert row["version"].startswith("arXiv:"), sid
    # the paper's Table 1 and its web replication are two sources of the same quantity, with other numbers
    assert published_value(pub, "arxiv-v2-table1", "100M", "baseline", "tail_mean_val_loss") == 3.031
    assert published_value(pub, "arxiv-v2-web", "100M", "baseline", "tail_mean_val_loss") == 3.336


def test_default_sources_are_the_table_records():
    """Which source a table quotes by default is its registry record's; the schema and the default config name no
    table (the config check fills the defaults in), paper.yaml chooses the web replication for Table 1."""
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())["properties"]["published"]
    assert "properties" not in schema and schema["additionalProperties"] == {"type": "string"}
    assert "published" not in yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert default_sources() == {n: s.source for n, s in TABLES.items() if s.source}
    assert default_sources()["table1"] == "arxiv-v2-table1" and "released" not in default_sources()
    assert set(default_sources().values()) <= set(load_sources().index)
    assert yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["published"]["table1"] == "arxiv-v2-web"


def _table1(tmp_path, name, **published):
    paths = [fx.write_run(tmp_path, v, "100M", s, 3.0 + 0.01 * s - (0.05 if v == "mhar" else 0), h)
             for s in (0, 1) for v, h in (("baseline", None), ("mhar", 8))]
    make_table("table1", paths, tmp_path / name, published=published or None)
    return pd.read_csv(tmp_path / f"{name}.csv").set_index("variant"), (tmp_path / f"{name}.md").read_text()


def test_switching_the_source_changes_the_published_column(tmp_path):
    df, md = _table1(tmp_path, "default")
    assert df.loc["baseline", "published_loss"] == 3.031 and df.loc["mhar", "published_loss"] == 2.969
    assert set(df["published_source"]) == {"arxiv-v2-table1"}
    assert "arxiv-v2-table1: Luo, Cai, Hu: Multi-Head Attention Residuals, arXiv:2607.27230v2, Table 1" in md
    # where another source gives the same quantity another value, the row and the notes say so
    assert "arxiv-v2-web 3.336" in df.loc["baseline", "published_others"]
    assert "Sources disagree" in md
    web, md_web = _table1(tmp_path, "web", table1="arxiv-v2-web")
    assert web.loc["baseline", "published_loss"] == 3.336 and web.loc["mhar", "published_loss"] == 3.287
    assert web.loc["mhar", "published_delta"] == pytest.approx(3.287 - 3.336)
    assert set(web["published_source"]) == {"arxiv-v2-web"} and "web replication" in md_web
    # our own numbers do not move
    assert web["loss_mean"].tolist() == df["loss_mean"].tolist()


def test_report_setup_names_the_sources_quoted(tmp_path):
    from analysis.report import build_report

    _table1(tmp_path, "table1", table1="arxiv-v2-web")
    text = build_report(tmp_path, tmp_path / "REPORT.md")
    setup = text[:text.index("## How to read the verdicts")]
    assert "**Published numbers quoted**" in setup
    assert "- `table1`: arxiv-v2-web: Luo, Cai, Hu: Multi-Head Attention Residuals, arXiv:2607.27230v2, web " \
           "replication" in setup and "other sources disagree" in setup


def test_unknown_source_is_one_error_line(tmp_path, capsys):
    paths = [fx.write_run(tmp_path, "baseline", "100M", 0, 3.0)]
    assert tables_main(["table1", "--inputs", *map(str, paths), "--out", str(tmp_path / "t"),
                        "--published", "arxiv-v9-table7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: published source 'arxiv-v9-table7' is unknown")
    assert not (tmp_path / "t.csv").exists()


# --- sizes from the preset record ---------------------------------------------------------------------
def test_a_toy_size_preset_is_ordered_and_compared_from_its_record(tmp_path):
    toy = Preset("toy_mid", order=4, model=dict(PRESETS["tiny"].model), paper_scale="350M")
    register_preset(toy)  # one place: the record (the tables read order and paper scale from it)
    try:
        assert paper_scale("toy_mid") == ("350M", True) and paper_scale("tiny") == ("100M", False)
        paths = [fx.write_run(tmp_path, v, size, s, 3.0 + 0.01 * s, h, label=v)
                 for size in ("toy_mid", "tiny") for s in (0, 1) for v, h in (("mhar", 8), ("baseline", None))]
        make_table("table1", paths, tmp_path / "t1")
        df = pd.read_csv(tmp_path / "t1.csv")
        assert df["size"].tolist() == ["tiny", "tiny", "toy_mid", "toy_mid"]  # preset order: tiny 1, toy_mid 4
        assert df["method"].tolist() == ["baseline", "MHAR H=8"] * 2  # variant display and order: the registry
        mid = df[df["size"] == "toy_mid"].set_index("variant")
        assert bool(mid.loc["mhar", "same_scale"]) and mid.loc["mhar", "published_loss"] == 2.848  # 350M, H=8
    finally:
        PRESETS.pop("toy_mid")


def test_a_recorded_display_names_and_orders_the_row(tmp_path):
    """summary.json's `display` (what the trainer records) is read as it is, without the registry."""
    paths = []
    for seed in (0, 1):
        paths.append(fx.write_run(tmp_path, "baseline", "tiny", seed, 3.0 + 0.01 * seed))
        p = fx.write_run(tmp_path, "mhar", "tiny", seed, 2.9 + 0.01 * seed, 8)
        d = json.loads(p.read_text())
        d["display"] = {"display": "routed", "order": -1, "shows_heads": True}
        p.write_text(json.dumps(d))
        paths.append(p)
    make_table("table1", paths, tmp_path / "t1")
    assert pd.read_csv(tmp_path / "t1.csv")["method"].tolist() == ["routed H=8", "baseline"]


def test_display_record_carries_a_fixed_head_count():
    from mhar.model.residuals import display_record

    assert display_record("attnres") == {"display": "single-head (AttnRes)", "order": 2, "shows_heads": False,
                                         "heads": 1}
    assert "heads" not in display_record("baseline") and display_record("mhar")["shows_heads"]


# --- task facts in the task YAML -------------------------------------------------------------------------
TOY_TASK = """\
task: toy_spelling
dataset_path: json
dataset_kwargs:
  data_files:
    test: toy/test.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "{{q}}"
doc_to_target: 0
doc_to_choice: ["a", "b"]
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
  primary_metric: acc_norm
"""


def test_a_toy_task_names_its_primary_metric_in_its_yaml(tmp_path):
    """A task added as one YAML (here in a tmp include path) names the metric the downstream table compares:
    lm-eval carries the YAML's metadata into the task config that eval.run records in results.json."""
    from lm_eval.api.task import TaskConfig
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "toy.yaml").write_text(TOY_TASK)
    entry = TaskManager(include_path=[str(tasks)], include_defaults=False).task_index["toy_spelling"]
    config = TaskConfig(**load_yaml(entry.yaml_path)).to_dict()  # what results["configs"][task] holds
    assert config["metadata"]["primary_metric"] == "acc_norm"

    rng = np.random.default_rng(0)
    acc, acc_norm = (rng.random(60) < 0.5).astype(float), (rng.random(60) < 0.5).astype(float)
    dirs = []
    for variant, heads, shift in (("baseline", None, 0.0), ("mhar", 4, 1.0)):
        run = fx.write_run(tmp_path, variant, "100M", 0, 3.0, heads).parent
        d = fx.write_run_eval(run, {"toy_spelling": acc})
        lines = [json.loads(x) for x in (d / "toy_spelling" / "samples.jsonl").read_text().splitlines()]
        for rec, v in zip(lines, acc_norm):  # acc is the same for both arms; acc_norm differs for mhar
            rec["metrics"]["acc_norm"] = float(v if not shift else 1.0)
        (d / "toy_spelling" / "samples.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
        res = json.loads((d / "toy_spelling" / "results.json").read_text())
        res["lm_eval"] = {"config": config}
        (d / "toy_spelling" / "results.json").write_text(json.dumps(res))
        dirs.append(d)
    row = downstream_table(dirs, n_resamples=199).rows[0]
    assert row["task"] == "toy_spelling" and row["metric"] == "acc_norm"
    assert row["delta"] == pytest.approx(1.0 - acc_norm.mean())
    # without the metadata the default rule compares acc (the first of DEFAULT_METRICS it records)
    for d in dirs:
        rp = d / "toy_spelling" / "results.json"
        res = json.loads(rp.read_text())
        del res["lm_eval"]
        rp.write_text(json.dumps(res))
    assert downstream_table(dirs, n_resamples=199).rows[0]["metric"] == "acc"


def test_a_declared_primary_metric_the_records_lack_is_refused_not_replaced(tmp_path, capsys):
    """A task YAML whose metadata.primary_metric names a metric the task does not produce (f1) was tabulated on
    acc without a word: one error line naming the task, the metric and the metrics it produces."""
    config = {"task": "toy_spelling", "metadata": {"version": 1.0, "primary_metric": "f1"}}
    rng = np.random.default_rng(0)
    dirs = []
    for variant, heads in (("baseline", None), ("mhar", 4)):
        run = fx.write_run(tmp_path, variant, "100M", 0, 3.0, heads).parent
        d = fx.write_run_eval(run, {"toy_spelling": (rng.random(40) < 0.5).astype(float)})
        rp = d / "toy_spelling" / "results.json"
        rp.write_text(json.dumps({**json.loads(rp.read_text()), "lm_eval": {"config": config}}))
        dirs.append(d)
    with pytest.raises(AnalysisInputError, match=r"task toy_spelling: metadata.primary_metric 'f1' is not a metric "
                                                 r"it produces \(acc, acc_norm\)"):
        downstream_table(dirs, n_resamples=199)
    capsys.readouterr()
    out = tmp_path / "reports" / "downstream"
    rc = tables_main(["downstream", "--evals", *map(str, dirs), "--out", str(out), "--resamples", "199"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc != 0 and len(lines) == 1 and lines[0].startswith("error: ") and "'f1'" in lines[0], err
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_local_task_yamls_state_their_facts():
    facts = {}
    for p in sorted((ROOT / "eval" / "tasks").glob("*.yaml")):
        d = yaml.safe_load(p.read_text().replace("!function", ""))
        facts[d["task"]] = d["metadata"]
    assert {t: f["primary_metric"] for t, f in facts.items()} == {
        "gpqa_main_zeroshot": "acc", "gsm8k": "exact_match", "hellaswag": "acc", "lambada_openai": "acc",
        "wikitext": "word_perplexity"}
    assert facts["hellaswag"]["cluster_field"] == "source_id"
