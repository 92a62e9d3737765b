"""Regenerating the report from unchanged inputs rewrites no tracked byte (`git status` stays clean).

What the report rules write - tables (csv/md/tex), figures (png/pdf), probe JSONs, REPORT.md - is generated
twice here with a different clock, git state, package record and data-mirror location in between; the tracked
files must be byte-identical, and the provenance that does change goes to the untracked `*.provenance.json`
beside each output (mhar.runs.sidecar). `snakemake --cores all report` twice is the end-to-end form of this test.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fixtures_analysis as fx
from eval import probe
from analysis import figures, report
from mhar.runs import sidecar
from analysis.tables.build import make_table
from mhar.runs import provenance as mprov

TRACKED = ("*.csv", "*.md", "*.tex", "*.png", "*.pdf", "*.json")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for pat in TRACKED for p in sorted(root.rglob(pat))
            if not p.name.endswith(sidecar.SUFFIX)}


def _retime(work: Path, factor: float) -> None:
    """A rerun of training on a busier machine: the same losses and FLOPs, another wall-clock."""
    for summary in (work / "runs").rglob("summary.json"):
        d = json.loads(summary.read_text())
        d["wall_s"] *= factor
        d["tokens_per_s"] /= factor
        summary.write_text(json.dumps(d))
        metrics = summary.parent / "metrics.jsonl"
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
        metrics.write_text("\n".join(json.dumps({**x, "wall_s": x["wall_s"] * factor}) for x in lines) + "\n")


def _inputs(work: Path) -> dict:
    """Inputs of every report rule, as fixtures: runs (Table 1, seeds, heads), eval dirs (downstream, CPT),
    benchmark records (cost) and probe JSONs (routing heatmap)."""
    runs = fx.make_runs(work, sizes=("tiny",), seeds=(0, 1))
    ds, _ = fx.make_downstream(work / "ds", n=60)
    cpt, _ = fx.make_cpt(work / "cp", n=200)
    bench = fx.write_bench_training(work / "bench" / "training.csv")
    rng = np.random.default_rng(0)
    probes = []
    for variant, heads in (("attnres", 1), ("mhar", 4)):
        p = Path("reports") / "probe" / "tiny" / f"{variant}.json"  # the probe rule's output: read, never rewritten
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"model": f"results/runs/{variant}/tiny/seed0/x/model.pt", "variant": variant,
                                 "routing_heads": heads, "size": "tiny", "slices": 4, "n_tokens": 64,
                                 "kl_trained": 0.2, "kl_null": 0.05, "mean_pairwise_cosine": 0.3,
                                 "routing_mean": {s: rng.dirichlet(np.ones(n), size=heads).tolist()
                                                  for s, n in (("L0.attn", 1), ("L0.mlp", 2), ("final", 3))}}))
        probes.append(p)
    return {"runs": runs, "ds": ds, "cpt": cpt, "bench": [bench], "probes": probes}


def _generate(work: Path, rep: Path, monkeypatch, when: str, commit: str, inputs: dict) -> None:
    """What the report rules write, as the workflow calls them: every table, every figure, REPORT.md."""
    monkeypatch.setattr(mprov, "utc_now", lambda: when)
    monkeypatch.setattr(mprov, "git_info", lambda *a, **k: {"commit": commit, "dirty": True, "root": str(work)})
    runs = sorted((work / "runs").rglob("summary.json"))
    for name in ("table1", "seeds", "heads"):
        make_table(name, runs, rep / name, command=f"python -m analysis.tables {name} ...")
    make_table("downstream", inputs["ds"], rep / "downstream", n_resamples=199)
    make_table("cpt", inputs["cpt"], rep / "cpt", n_resamples=99)
    make_table("cost", inputs["bench"], rep / "cost")
    figure_inputs = {"loss_curves": runs, "loss_vs_compute": runs, "head_sweep": runs,
                     "forest": [rep / "table1.csv", rep / "downstream.csv"], "cost": [rep / "cost.csv"],
                     "routing_heatmap": inputs["probes"]}
    assert set(figure_inputs) == set(figures.KINDS) == set(report.FIGURES)
    for kind, files in figure_inputs.items():
        figures.make_figure(kind, files, rep / "figures" / kind)
    report.build_report(rep, rep / "REPORT.md")


def test_report_outputs_do_not_change_with_time_git_or_location(tmp_path, monkeypatch):
    """Every tracked file the report rules write is byte-identical on a rerun with the same inputs - also when the
    runs were retrained on a busier machine (loss_vs_compute.pdf/.png changed: it drew the runs' wall-clock)."""
    monkeypatch.chdir(tmp_path)
    inputs = _inputs(tmp_path)
    rep = Path("reports")  # relative, as the workflow passes it
    _generate(tmp_path, rep, monkeypatch, "2026-01-01T00:00:00+00:00", "a" * 40, inputs)
    first = _snapshot(rep)
    tables = ("table1", "seeds", "heads", "downstream", "cpt", "cost")
    want = {f"{t}.{ext}" for t in tables for ext in ("md", "csv", "tex")}
    want |= {f"figures/{k}.{ext}" for k in figures.KINDS for ext in ("png", "pdf")} | {"REPORT.md"}
    assert want <= set(first), want - set(first)
    assert "Nothing: every table and figure is present." in first["REPORT.md"].decode()
    _retime(tmp_path, 1.7)
    _generate(tmp_path, rep, monkeypatch, "2027-06-30T12:34:56+00:00", "b" * 40, inputs)
    second = _snapshot(rep)
    assert sorted(first) == sorted(second)
    changed = [k for k in first if first[k] != second[k]]
    assert not changed, changed
    for k, text in first.items():
        if k.endswith((".md", ".tex", ".csv")):
            assert "2026-01-01" not in text.decode() and "a" * 40 not in text.decode(), k
    # the provenance that changed is kept, outside git's view
    side = json.loads(sidecar.path_for(rep / "table1").read_text())
    assert side["generated_utc"].startswith("2027-06-30") and side["git"]["commit"] == "b" * 40
    assert json.loads(sidecar.path_for(rep / "REPORT.md").read_text())["git"]["commit"] == "b" * 40
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert f"*{sidecar.SUFFIX}" in ignored and "/results/benchmarks/" in ignored


def test_figure_metadata_carries_no_timestamp(tmp_path):
    """PDF without CreationDate / ModDate, PNG with a fixed Software key and no time in any text chunk."""
    from PIL import Image

    runs = fx.make_runs(tmp_path, sizes=("tiny",), seeds=(0,))
    figures.make_figure("loss_curves", runs, tmp_path / "f")
    pdf = (tmp_path / "f.pdf").read_bytes()
    assert b"/CreationDate" not in pdf and b"/ModDate" not in pdf
    info = Image.open(tmp_path / "f.png").info
    assert info["Software"] == "mhar analysis.figures"
    assert not [k for k, v in info.items() if isinstance(v, str) and ("generated_utc" in v or "Time" in k)]


def test_probe_record_names_the_text_relative_to_the_data_mirror(tmp_path, monkeypatch):
    """`token_source: text:/abs/path/...` made every probe JSON differ when MHAR_DATA_DIR moved."""
    from mhar.data.tokenizer import get_tokenizer

    tok = get_tokenizer("byte")
    sources = []
    for where in ("mirror_a", "elsewhere/mirror_b"):
        root = tmp_path / where / "wikitext-2-raw-v1"
        root.mkdir(parents=True)
        (root / "wiki.valid.raw").write_text("= Valkyria =\n" + "The quick brown fox jumps over the dog . " * 80)
        monkeypatch.setenv("MHAR_DATA_DIR", str(tmp_path / where))
        ids, src = probe.probe_tokens(tok, 256, 2, 32)
        sources.append(src)
    assert sources[0] == sources[1] == "text:$MHAR_DATA_DIR/wikitext-2-raw-v1/wiki.valid.raw"
    assert str(tmp_path) not in sources[0]


@pytest.mark.parametrize("kind", ["table", "figure"])
def test_outputs_name_inputs_as_given(tmp_path, monkeypatch, kind):
    """The tracked record names inputs as the command gave them (relative), never resolved to absolute paths."""
    monkeypatch.chdir(tmp_path)
    runs = [Path(p).relative_to(tmp_path) for p in fx.make_runs(tmp_path, sizes=("tiny",), seeds=(0, 1))]
    if kind == "table":
        make_table("table1", runs, Path("out") / "t")
        text = (tmp_path / "out" / "t.md").read_text()
    else:
        figures.make_figure("loss_curves", runs, Path("out") / "f")
        from PIL import Image

        text = Image.open(tmp_path / "out" / "f.png").info["Description"]
    assert str(tmp_path) not in text and str(runs[0]) in text
    shutil.rmtree(tmp_path / "out")
