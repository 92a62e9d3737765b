"""analysis.tables / analysis.report / eval.published.csv on synthetic result files with planted effects."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as sps
import yaml
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

try:  # tests/ on sys.path (pytest's default rootdir-less import mode)
    import fixtures_analysis as fx
except ImportError:  # tests imported as a package
    from tests import fixtures_analysis as fx
from analysis import report, stats as st, verdict as vd
from analysis.load.bench import load_bench, provider_name
from analysis.load.common import AnalysisInputError
from analysis.load.published import load_published, paper_scales, published_value
from analysis.load.runs import identify_eval, load_summaries, load_summary
from analysis.tables.rows import group_runs, run_label
from analysis.load.samples import load_eval_task
from analysis.tables.build import make_table, main as tables_main
from analysis.tables.cost import ROUTING_ROWS, cost_table
from analysis.tables.cpt import cpt_table
from analysis.tables.downstream import downstream_table
from analysis.tables.render import to_markdown, write_table
from analysis.tables.table1 import table1

PAPER = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "PAPER.md"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return fx.make_runs(root)


def _read(prefix: Path) -> pd.DataFrame:
    for ext in (".csv", ".md", ".tex"):
        assert prefix.with_name(prefix.name + ext).stat().st_size > 0
    return pd.read_csv(prefix.with_name(prefix.name + ".csv"))


# --- published.csv ---------------------------------------------------------------------------
def test_published_csv_schema_and_units():
    pub = load_published()
    assert {"table", "scale", "method", "heads", "task", "metric", "value", "source"} <= set(pub.columns)
    assert pub["source"].notna().all()
    assert published_value(pub, "arxiv-v2-table1", "1B", "mhar", "tail_mean_val_loss", heads=8) == 2.754
    assert published_value(pub, "arxiv-v2-table2", "1B", "mhar", "acc", task="lambada_openai") == pytest.approx(0.16)
    assert published_value(pub, "arxiv-v2-cost", "1B", "eager", "throughput_ratio") is None  # OOM in the paper
    assert published_value(pub, "arxiv-v2-table3-mcnemar", "8B", "mhar_vs_plain", "p_value", task="gsm8k") == 0.004


@pytest.mark.skipif(not PAPER.is_file(), reason="shared/reference/PAPER.md not present")
def test_published_csv_matches_paper_tables():
    """Parse the markdown tables of PAPER.md independently and compare every number."""
    text = PAPER.read_text()
    pub = load_published()

    def rows_until_blank(header_start):
        lines = text[text.index(header_start):].splitlines()
        out = []
        for ln in lines[2:]:
            if not ln.startswith("|"):
                break
            out.append([c.strip() for c in ln.strip("|").split("|")])
        return out

    t1 = rows_until_blank("| scale | baseline | hyper-conn")
    keys = [("baseline", None), ("hyper", None), ("attnres", 1), ("mhar", 8), ("mhar", 16)]
    for row in t1:
        for (m, h), v in zip(keys, row[1:]):
            assert published_value(pub, "arxiv-v2-table1", row[0], m, "tail_mean_val_loss", heads=h) == float(v.rstrip("."))
    t2 = rows_until_blank("| scale | method | WikiText-2 ppl")
    for sc, meth, ppl, lam, hs in t2:
        m = "mhar" if meth == "MHAR" else "baseline"
        assert published_value(pub, "arxiv-v2-table2", sc, m, "word_perplexity", task="wikitext") == float(ppl)
        assert published_value(pub, "arxiv-v2-table2", sc, m, "acc", task="lambada_openai", as_fraction=False) == float(lam)
        assert published_value(pub, "arxiv-v2-table2", sc, m, "acc", task="hellaswag", as_fraction=False) == float(hs)
    t3 = rows_until_blank("| task | base | plain CPT | +MHAR |")
    assert len(t3) == 6
    got = pub[pub["table"] == "cpt"].pivot_table(index="task", columns="method", values="value", sort=False)
    for row, (task, r) in zip(t3, got.iterrows()):
        assert [float(x) for x in row[1:]] == [r["base"], r["plain"], r["mhar"]]
    cost = rows_until_blank("| routing | 100M thr / GB")
    names = {"baseline": "baseline", "eager reference": "eager", "torch.compile": "compile",
             "fused Triton (authors)": "fused"}
    for row in cost:
        for scale, cell in zip(paper_scales(), row[1:]):
            if cell.startswith("OOM"):
                assert published_value(pub, "arxiv-v2-cost", scale, names[row[0]], "throughput_ratio") is None
                continue
            thr, gb = (float(x) for x in cell.split(" / "))
            assert published_value(pub, "arxiv-v2-cost", scale, names[row[0]], "throughput_ratio") == thr
            assert published_value(pub, "arxiv-v2-cost", scale, names[row[0]], "peak_mem_gb") == gb
    item = r"[-+][\d.]+\+-[\d.]+"
    triple = rf"({item}, {item}, {item})"
    seeds = re.search(rf"HC {triple};\s*single {triple};\s*MHAR {triple}", " ".join(text.split()))
    for method, grp in zip(("hyper", "attnres", "mhar"), seeds.groups()):
        for scale, item in zip(paper_scales(), grp.split(", ")):
            d, sd = (float(x) for x in item.split("+-"))
            assert published_value(pub, "arxiv-v2-seeds", scale, method, "delta_vs_baseline") == d
            sel = pub[(pub["table"] == "seeds") & (pub["scale"] == scale) & (pub["method"] == method)]
            assert float(sel["sd"].iloc[0]) == sd
    probe = re.search(r"trained ([\d.]+) / ([\d.]+)\s+/ ([\d.]+), null ([\d.]+) / ([\d.]+) / ([\d.]+)", text)
    for i, scale in enumerate(paper_scales()):
        assert published_value(pub, "arxiv-v2-probe", scale, "attnres", "kl_slice_shared") == float(probe.group(1 + i))
        assert published_value(pub, "arxiv-v2-probe", scale, "null", "kl_slice_shared") == float(probe.group(4 + i))
    sweep = re.search(r"H = 1/4/8/16 -> ([\d./ ]+)", text).group(1).split(" / ")
    for h, v in zip((1, 4, 8, 16), sweep):
        assert published_value(pub, "arxiv-v2-heads", "1B", "mhar", "tail_mean_val_loss", heads=h) == float(v.rstrip("."))


# --- from-scratch tables -----------------------------------------------------------------------------
def test_table1_recovers_planted_deltas_and_pvalues(runs, tmp_path):
    make_table("table1", runs, tmp_path / "t1")
    df = _read(tmp_path / "t1")
    groups = group_runs(load_summaries(runs))
    for _, r in df[df["variant"] != "baseline"].iterrows():
        heads = None if pd.isna(r["heads"]) else int(r["heads"])
        var = groups[(r["variant"], r["size"], heads, ())]
        base = groups[("baseline", r["size"], None, ())]
        a = np.array([var[s].tail_mean_val_loss for s in sorted(var)])
        b = np.array([base[s].tail_mean_val_loss for s in sorted(base)])
        ref = sps.ttest_rel(a, b)
        assert r["delta"] == pytest.approx(np.mean(a - b))
        assert r["p"] == pytest.approx(ref.pvalue)
        assert r["loss_mean"] == pytest.approx(a.mean()) and r["loss_sd"] == pytest.approx(a.std(ddof=1))
        assert r["seeds"] == "0 1 2" and r["judged"] == ("sign and magnitude" if r["same_scale"] else "sign only")
    # Holm across the table's rows (statsmodels), and the verdict from the adjusted p
    from statsmodels.stats.multitest import multipletests

    judged = df[df["variant"] != "baseline"]
    assert judged["p_holm"].tolist() == pytest.approx(multipletests(judged["p"], method="holm")[1].tolist())
    for _, r in judged.iterrows():
        res = st.PairedResult(r["delta"], r["ci_low"], r["ci_high"], r["p"], 3, "t")
        assert r["verdict"] == vd.decide(res, r["published_delta"], r["same_scale"], r["p_holm"])
    tiny = judged[judged["size"] == "tiny"].set_index("method")
    assert tiny.loc["MHAR H=8", "verdict"] == vd.SAME_SIGN  # sign only at a non-paper size, and it says so
    m100 = judged[judged["size"] == "100M"].set_index("method")
    # planted -0.05 vs the paper's -0.062 at its own scale, tight CI: the magnitude is judged
    assert m100.loc["MHAR H=8", "verdict"].startswith(vd.EFFECT_DIFFERS + ": smaller")
    mh = df[(df["variant"] == "mhar") & (df["heads"] == 4) & (df["size"] == "tiny")].iloc[0]
    assert mh["delta"] == pytest.approx(-0.04, abs=0.004)
    assert mh["published_delta"] == pytest.approx(2.969 - 3.031)  # non-paper H -> H=8 row, 100M scale
    assert not mh["same_scale"]
    md = (tmp_path / "t1.md").read_text()
    assert "3.031 (100M)" in md and "MHAR H=4" in md and "analysis/verdict.py" in md and "p (Holm)" in md
    tex = (tmp_path / "t1.tex").read_text()
    body = "\n".join(ln for ln in tex.splitlines() if not ln.startswith("%"))  # % lines are TeX comments
    assert r"\begin{tabular}" in body and r"$\pm$" in body and "_" not in body.replace(r"\_", "")


def test_table1_flags_opposite_sign_as_not_reproduced(tmp_path):
    paths = fx.make_runs(tmp_path, sizes=("100M",), effects={("mhar", 8): +0.03})
    make_table("table1", paths, tmp_path / "t1")
    df = pd.read_csv(tmp_path / "t1.csv")
    assert df.loc[df["variant"] == "mhar", "verdict"].item() == vd.NOT_REPRODUCED


def test_single_seed_is_insufficient_evidence(tmp_path):
    paths = fx.make_runs(tmp_path, sizes=("tiny",), seeds=(0,), effects={("mhar", 4): -0.04})
    make_table("table1", paths, tmp_path / "t1")
    df = pd.read_csv(tmp_path / "t1.csv")
    row = df[df["variant"] == "mhar"].iloc[0]
    assert row["verdict"] == vd.INSUFFICIENT and pd.isna(row["p"])


def test_seeds_table_per_seed_deltas(runs, tmp_path):
    make_table("seeds", runs, tmp_path / "s")
    df = _read(tmp_path / "s")
    groups = group_runs(load_summaries(runs))
    r = df[(df["variant"] == "attnres") & (df["size"] == "100M")].iloc[0]
    a, b = groups[("attnres", "100M", 1, ())], groups[("baseline", "100M", None, ())]
    d = [a[s].tail_mean_val_loss - b[s].tail_mean_val_loss for s in (0, 1, 2)]
    assert [float(x) for x in r["per_seed_delta"].split()] == pytest.approx(d, abs=1e-4)
    assert r["delta_sd"] == pytest.approx(np.std(d, ddof=1))
    assert r["mde80"] == pytest.approx(st.mde_paired(3, np.std(d, ddof=1)))
    assert r["published_delta"] == -0.043 and r["published_sd"] == 0.003


def test_heads_table_finds_planted_u_shape(runs, tmp_path):
    make_table("heads", runs, tmp_path / "h")
    df = pd.read_csv(tmp_path / "h.csv")
    tiny = df[df["size"] == "tiny"].set_index("heads")
    assert list(tiny.index) == [1, 4, 8, 16]
    assert tiny["best"].idxmax() == 8 and bool(tiny.loc[8, "interior_best"])
    assert tiny.loc[8, "published_delta"] == pytest.approx(3.129 - 3.270)  # 1B sweep for non-paper sizes
    assert pd.isna(tiny.loc[1, "delta"])


def test_a_summary_of_an_earlier_shape_is_refused_naming_the_script(tmp_path, capsys):
    """Summaries without the run block (flat keys, residual section in config.yaml), without run.config, or
    without the display record: one line naming the file and the script that converts them."""
    p = fx.write_run(tmp_path, "mhar", "tiny", 0, 3.0, heads=16, label="mhar_h16")
    cur = json.loads(p.read_text())
    s = load_summary(p)
    assert (s.variant, s.heads, s.name, run_label(s)) == ("mhar", 16, "mhar_h16", "MHAR H=16")
    flat = {k: v for k, v in cur.items() if k not in ("run", "display")}
    no_config = {**cur, "run": {k: v for k, v in cur["run"].items() if k != "config"}}
    no_display = {k: v for k, v in cur.items() if k != "display"}
    for old, what in ((flat, "no 'run' block"), (no_config, "no 'config'"), (no_display, "no 'display'")):
        p.write_text(json.dumps(old))
        with pytest.raises(AnalysisInputError, match=what) as e:
            load_summary(p)
        assert str(p) in str(e.value) and "python scripts/migrate_records.py" in str(e.value)
        assert tables_main(["table1", "--inputs", str(p), "--out", str(tmp_path / "t")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "scripts/migrate_records.py" in err[0], err


def test_a_new_variant_needs_no_display_entry(tmp_path, monkeypatch):
    """A variant without a display name of its own (a new or a user's own) shows its run label and is compared
    with the baseline like a built-in one."""
    from tests.toy_variant import GatedResidual

    monkeypatch.setattr(GatedResidual, "display_name", None)  # the toy declares one; this test is about none
    paths = []
    for seed in (0, 1):
        shock = 0.03 * seed
        paths.append(fx.write_run(tmp_path, "baseline", "tiny", seed, 4.0 + shock))
        # a variant outside mhar.model.residuals is found through its module, as a user's run config names it
        paths.append(fx.write_run(tmp_path, "toy_gated", "tiny", seed, 4.0 + shock - 0.05 + 0.001 * seed,
                                  1, label="toy_gate",
                                  overrides=["model.residual.module=tests.toy_variant"]))
    s = load_summary(paths[1])
    assert (s.variant, run_label(s)) == ("toy_gated", "toy_gate")
    make_table("table1", paths, tmp_path / "t1")
    df = pd.read_csv(tmp_path / "t1.csv").set_index("method")
    assert set(df.index) == {"baseline", "toy_gate"}
    assert df.loc["toy_gate", "delta"] == pytest.approx(-0.05 + 0.0005, abs=1e-3)


def test_bad_inputs_give_clear_errors(tmp_path, capsys):
    bad = tmp_path / "summary.json"
    bad.write_text(json.dumps({"variant": "mhar", "size": "tiny", "seed": 0}))
    assert tables_main(["table1", "--inputs", str(bad), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "tail_mean_val_loss" in err and str(bad) in err
    with pytest.raises(AnalysisInputError, match="not found"):
        load_summary(tmp_path / "nope.json")


def test_nonfinite_summary_and_unwritable_out_are_one_line_errors(tmp_path, capsys):
    """A diverged run's NaN loss is refused, not tabulated; an --out that cannot be written is an error line."""
    good = fx.write_run(tmp_path, "baseline", "tiny", 0, 2.0)
    bad = fx.write_run(tmp_path, "mhar", "tiny", 0, 2.0, heads=4)
    s = json.loads(bad.read_text())  # write_run returns the summary.json path
    s["tail_mean_val_loss"] = float("nan")
    bad.write_text(json.dumps(s))
    assert tables_main(["table1", "--inputs", str(good), str(bad), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "non-finite tail_mean_val_loss" in err[0]
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert tables_main(["table1", "--inputs", str(good), "--out", str(blocker / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write")


def test_same_run_twice_is_an_error(runs, tmp_path):
    with pytest.raises(AnalysisInputError, match="same run"):
        table1([runs[0], runs[0]])


# --- question-level tables ------------------------------------------------------------------------------
def test_downstream_table_paired_tests(tmp_path):
    dirs, truth = fx.make_downstream(tmp_path, n_groups=15, tokenizer="hf:Qwen/Qwen3-0.6B")  # the paper's
    assert tables_main(["downstream", "--inputs", *map(str, dirs), "--out", str(tmp_path / "d"),
                        "--resamples", "999"]) == 0
    df = _read(tmp_path / "d").set_index("task")
    lam = df.loc["lambada_openai"]
    b, c = st.discordant_counts(truth["lam_m"], truth["lam_b"])
    assert (lam["discordant_variant_better"], lam["discordant_baseline_better"]) == (b, c)
    assert lam["mcnemar_p"] == pytest.approx(sm_mcnemar(np.array([[0, b], [c, 0]]), exact=True).pvalue)
    assert lam["delta"] == pytest.approx(np.mean(truth["lam_m"] - truth["lam_b"]))
    # grouped questions: the cluster-robust t decides, and its p is the one printed
    cl = st.cluster_se(truth["lam_m"] - truth["lam_b"], truth["groups"])
    assert lam["cluster_se"] == pytest.approx(cl.se) and lam["p"] == pytest.approx(cl.p_value)
    assert lam["test"].startswith("cluster-robust t (15 clusters")
    # planted +0.15 at the paper's own scale (100M), one seed per arm: these two models differ, and that is all
    # a question-level test of one model per arm can say (it used to be judged 'effect differs: larger')
    assert lam["published_delta"] == pytest.approx(0.024) and lam["verdict"] == vd.MODELS_DIFFER
    assert set(df["judged"]) == {vd.SINGLE_SEED_JUDGED} and not (df["verdict"] == vd.REPRODUCED).any()
    wt = df.loc["wikitext"]
    ppl = lambda ll: np.exp(-ll.sum() / truth["words"].sum())  # noqa: E731
    assert wt["ours_baseline"] == pytest.approx(ppl(truth["ll_b"]))
    assert wt["delta"] == pytest.approx(ppl(truth["ll_m"]) - ppl(truth["ll_b"]))
    assert wt["ci_high"] < 0 and wt["test"].startswith("document bootstrap") and wt["verdict"] == vd.MODELS_DIFFER
    assert wt["metric"] == "word_perplexity" and wt["published_metric"] == "word_perplexity"


def test_byte_level_runs_compare_bits_per_byte_not_word_perplexity(tmp_path):
    """A byte-level model's word perplexity is not comparable with the paper's: WikiText compares bits per byte,
    and the paper's word-perplexity delta stands beside it marked as another metric (judged by its sign)."""
    dirs, truth = fx.make_downstream(tmp_path, n_groups=15)  # the run config's tokenizer: byte
    t = downstream_table(dirs, n_resamples=199)
    wt = next(r for r in t.rows if r["task"] == "wikitext")
    nbytes = truth["words"] * 5  # the fixture's byte counts
    bpb = lambda ll: -ll.sum() / nbytes.sum() / np.log(2)  # noqa: E731
    assert wt["metric"] == "bits_per_byte" and wt["published_metric"] == "word_perplexity"
    assert wt["ours_baseline"] == pytest.approx(bpb(truth["ll_b"]))
    assert wt["delta"] == pytest.approx(bpb(truth["ll_m"]) - bpb(truth["ll_b"])) and wt["ci_high"] < 0
    md = to_markdown(t)
    row = next(ln for ln in md.splitlines() if "wikitext" in ln)
    assert "bits_per_byte" in row and "word_perplexity" in row.split("|")[-4]  # the paper Δ column names its metric
    from analysis import report

    t.rows = [wt]
    write_table(t, tmp_path / "rep" / "downstream")
    reading = report.table_reading("downstream", tmp_path / "rep" / "downstream.csv")
    assert "bits_per_byte: Δ -" in reading and "(paper at 100M: lower word_perplexity; sign compared only)" in reading
    assert f"{wt['published_delta']:+.3f}" not in reading  # no word-perplexity number beside a bpb delta


def test_hellaswag_clusters_from_logged_doc(tmp_path):
    d = tmp_path / "hellaswag"
    d.mkdir()
    recs = [{"doc_id": i, "prompt_hash": "h", "metrics": {"acc": i % 2},
             "doc": {"source_id": f"activitynet~v_{i // 3}", "ctx": "..."}} for i in range(9)]
    (d / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    # the task's cluster field comes from its YAML's metadata, as lm-eval records the task config in results.json
    meta = yaml.safe_load((Path(__file__).parents[2] / "eval" / "tasks" / "hellaswag.yaml").read_text()
                          .replace("!function", ""))["metadata"]
    (d / "results.json").write_text(json.dumps({"n": 9, "lm_eval": {"config": {"metadata": meta}}}))
    t = load_eval_task(tmp_path, "hellaswag")
    assert [t.docs[i]["group"] for i in range(4)] == ["activitynet~v_0"] * 3 + ["activitynet~v_1"]
    (d / "results.json").write_text(json.dumps({"n": 9}))  # a record without the task's metadata: no clusters
    assert load_eval_task(tmp_path, "hellaswag").docs[0]["group"] is None


def test_downstream_rejects_prompt_mismatch(tmp_path):
    dirs, _ = fx.make_downstream(tmp_path, n=20)
    sp = dirs[1] / "hellaswag" / "samples.jsonl"
    lines = [json.loads(x) for x in sp.read_text().splitlines()]
    lines[3]["prompt_hash"] = "other"
    sp.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(AnalysisInputError, match="prompt_hash differs"):
        downstream_table(dirs, n_resamples=99)


def test_cpt_table_difference_in_differences(tmp_path):
    dirs, arms = fx.make_cpt(tmp_path)
    make_table("cpt", dirs, tmp_path / "c", n_resamples=1999)
    r = _read(tmp_path / "c").iloc[0]
    ref = st.did_contrasts(arms["base"], arms["plain"], arms["mhar"], n_resamples=1999)
    assert r["cpt_gain"] == pytest.approx(ref["cpt_gain"].estimate)
    assert r["total_gain"] == pytest.approx(ref["total_gain"].estimate)
    assert r["delta"] == pytest.approx(ref["mhar_gain"].estimate)
    assert r["delta"] == pytest.approx(r["total_gain"] - r["cpt_gain"])
    assert r["p"] == pytest.approx(ref["mhar_gain"].p_value)
    assert r["metric"] == "exact_match,strict-match" and r["published_delta"] == pytest.approx(0.032)
    # the same through a manifest that declares the paper's scale
    man = tmp_path / "cpt.yaml"
    man.write_text("base: cpt/base\nplain: cpt/plain\nmhar: cpt/mhar\nscale: 8B\n")
    t = cpt_table([man], n_resamples=999)
    assert t.rows[0]["same_scale"] and t.rows[0]["delta"] == pytest.approx(r["delta"])
    with pytest.raises(AnalysisInputError, match="three eval dirs"):
        cpt_table(dirs[:2])


def test_cost_table_ratios_and_verdicts(tmp_path):
    bench = fx.write_bench(tmp_path / "b.csv")
    make_table("cost", [bench], tmp_path / "cost")
    df = _read(tmp_path / "cost").set_index(["size", "provider"])
    raw = pd.read_csv(bench)
    base = raw[(raw["size"] == "100M") & (raw["provider"] == "baseline")]["tokens_per_s"].mean()
    fused = raw[(raw["size"] == "100M") & (raw["provider"] == "mhar_fused")]["tokens_per_s"].mean()
    assert df.loc[("100M", "fused"), "ratio"] == pytest.approx(fused / base)
    assert df.loc[("100M", "fused"), "published_ratio"] == 0.88
    assert df.loc[("100M", "fused"), "verdict"] == vd.REPRODUCED
    assert df.loc[("100M", "compile"), "verdict"] == vd.cost_verdict(
        df.loc[("100M", "compile"), "ratio"], df.loc[("100M", "compile"), "published_ratio"], True, se=df.loc[("100M", "compile"), "ratio_se"])
    assert df.loc[("tiny", "fused"), "verdict"].startswith(vd.NOT_JUDGED)
    # the SE of the ratio comes from the repeats (variant and baseline, delta method)
    sub = raw[(raw["size"] == "100M")]
    f, bb = sub[sub["provider"] == "mhar_fused"]["tokens_per_s"], sub[sub["provider"] == "baseline"]["tokens_per_s"]
    want = (f.mean() / bb.mean()) * np.sqrt((f.sem() / f.mean()) ** 2 + (bb.sem() / bb.mean()) ** 2)
    assert df.loc[("100M", "fused"), "ratio_se"] == pytest.approx(want)
    with pytest.raises(AnalysisInputError, match="provider"):
        bad = tmp_path / "bad.csv"
        bad.write_text("size,tokens_per_s\n100M,1\n")
        load_bench([bad])


def test_cost_table_reads_training_benchmark_format(tmp_path):
    bench = fx.write_bench_training(tmp_path / "training.csv")
    op = tmp_path / "routing_op.csv"
    op.write_text("provider,N,fwd_ms\nfused,9,1.0\n")  # another benchmark's CSV: refused, not skipped
    t = cost_table([bench])
    rows = {r["provider"]: r for r in t.rows}
    assert rows["fused"]["ratio"] == pytest.approx(0.45) and rows["fused"]["peak_mem_gb"] == 21.0
    assert 0.45 < 0.55 - 0.10  # in floating point; the old one-sided rule said "not reproduced" here
    assert rows["fused"]["verdict"] == vd.REPRODUCED  # 0.45 is exactly at the tolerance: within
    assert rows["compile"]["verdict"] == vd.REPRODUCED  # |0.25 - 0.23| <= 0.10
    assert rows["eager"]["status"] == "OOM" and rows["eager"]["verdict"] == vd.OOM
    md = to_markdown(t)
    assert "| 1B | eager | 0 | OOM | OOM |" in md
    with pytest.raises(AnalysisInputError, match="routing_op.csv: no tokens_per_s column"):
        load_bench([bench, op])
    with pytest.raises(AnalysisInputError, match="no training-throughput CSV given"):
        load_bench([])


def test_cost_table_adds_inference_records(tmp_path):
    """bench_inference.py CSVs listed in cost.bench_files: prefill / decode figures beside the training rows,
    ratios to the baseline of the same size; the training throughput is untouched; a training CSV alone gives
    no inference columns."""
    bench = fx.write_bench_training(tmp_path / "training.csv")
    inf = tmp_path / "inference.csv"
    inf.write_text("size,variant,routing_impl,heads,params,dtype,batch,prompt_tokens,new_tokens,repeats,prefill_s,"
                   "prefill_tok_s,decode_ms_per_token,peak_mem_gib,routing_autotune\n"
                   "1B,baseline,,,1,torch.bfloat16,8,512,32,3,0.06,60000.0,50.0,2.5,1\n"
                   "1B,mhar,fused,8,1,torch.bfloat16,8,512,32,3,0.08,45000.0,80.0,3.25,1\n")
    plain = {r["provider"]: r for r in cost_table([bench]).rows}
    t = cost_table([bench, inf])
    rows = {r["provider"]: r for r in t.rows}
    assert rows["fused"]["ratio"] == plain["fused"]["ratio"] == pytest.approx(0.45)
    assert rows["fused"]["prefill_ratio"] == pytest.approx(0.75)
    assert rows["fused"]["decode_ratio"] == pytest.approx(1.6)
    assert rows["fused"]["infer_peak_gb"] == pytest.approx(3.25)
    assert rows["baseline"]["prefill_ratio"] == pytest.approx(1.0)
    assert "prefill_tok_s" not in rows["compile"]  # not measured: no figures, no ratio
    md = to_markdown(t)
    assert "| 45000 (0.75) | 80.0 (1.60) | 3.25 |" in md
    assert "prefill" not in to_markdown(cost_table([bench]))
    with pytest.raises(AnalysisInputError, match="no training-throughput CSV given"):
        load_bench([inf])  # inference records alone make no cost table


def test_cost_table_reads_scoring_records_beside_older_ones(tmp_path):
    """bench_inference.py's scoring record (score_tok_s, transformers' rows, batch 8 and 1): the table shows the
    batch-8 scoring / decode figures with their ratios to the baseline, a note with transformers' figures, and
    ignores an older-format row of the same size (two benchmark versions are never averaged)."""
    bench = fx.write_bench_training(tmp_path / "training.csv")
    new = tmp_path / "inference.csv"
    new.write_text("size,variant,routing_impl,heads,batch,score_tokens,score_tok_s,prefill_tok_s,decode_ms_per_token,"
                   "peak_mem_gib\n"
                   "1B,hf,,,8,1024,131000,120000,26.7,4.38\n"
                   "1B,baseline,,,8,1024,212000,110000,4.0,2.80\n"
                   "1B,mhar,fused,8,8,1024,191000,50000,4.2,5.17\n"
                   "1B,baseline,,,1,2048,130000,76000,3.6,2.66\n"
                   "1B,mhar,fused,8,1,2048,49000,36000,4.2,3.15\n")
    old = tmp_path / "old.csv"
    old.write_text("size,variant,routing_impl,heads,params,dtype,batch,prompt_tokens,new_tokens,repeats,prefill_s,"
                   "prefill_tok_s,decode_ms_per_token,peak_mem_gib,routing_autotune\n"
                   "1B,mhar,fused,8,1,torch.bfloat16,8,512,32,3,0.08,45000.0,80.0,3.25,1\n")
    rows = {r["provider"]: r for r in cost_table([bench, new, old]).rows}
    assert rows["fused"]["score_ratio"] == pytest.approx(191000 / 212000)
    assert rows["fused"]["decode_ratio"] == pytest.approx(4.2 / 4.0)  # batch 8 only, the old row left out
    assert rows["fused"]["infer_peak_gb"] == pytest.approx(5.17) and "hf" not in rows
    t = cost_table([bench, new, old])
    md = to_markdown(t)
    assert "score tok/s (ratio)" in md and "| 191000 (0.90) |" in md
    assert any("Qwen3ForCausalLM" in n and "212000 vs 131000 tok/s" in n and "4.00 vs 26.70 ms/token" in n
               for n in t.notes)


def test_identify_eval_reads_the_run_block_and_refuses_earlier_results(tmp_path):
    """results.json: the run block and display record eval.run copies from the model; never the path. One of an
    earlier eval.run (no run block: it was traced through the model path) is refused naming the script; one of
    a model that records no run (hf:<name>) says so."""
    run = fx.write_run(tmp_path / "results", "mhar", "tiny", 1, 3.0, heads=8, label="mhar_h8").parent
    summary = json.loads((run / "summary.json").read_text())
    ev = tmp_path / "results" / "eval" / "somewhere"
    fx.write_eval(ev, str(run / "model.pt"), {"lambada_openai": np.ones(5)}, run=summary["run"],
                  display=summary["display"])
    info = identify_eval(ev)
    assert (info["variant"], info["size"], info["seed"], info["heads"], info["label"]) == ("mhar", "tiny", 1, 8,
                                                                                           "mhar_h8")
    old = tmp_path / "old"
    fx.write_eval(old, str(run / "model.pt"), {"lambada_openai": np.ones(5)})  # run: None, no display
    for drop in ("run", "display"):
        rec = json.loads((ev / "lambada_openai" / "results.json").read_text())
        del rec[drop]
        (old / "lambada_openai" / "results.json").write_text(json.dumps(rec))
        with pytest.raises(AnalysisInputError, match="scripts/migrate_records.py") as e:
            identify_eval(old)
        assert str(old / "lambada_openai" / "results.json") in str(e.value)
    hf = fx.write_eval(tmp_path / "hf", "hf:org/model", {"lambada_openai": np.ones(5)})
    with pytest.raises(AnalysisInputError, match="records no training run"):
        identify_eval(hf)


# --- report -----------------------------------------------------------------------------------------------
def test_report_with_only_table1_lists_missing(runs, tmp_path):
    rep = tmp_path / "reports"
    make_table("table1", runs, rep / "table1")
    assert report.main(["--reports", str(rep), "--out", str(rep / "REPORT.md")]) == 0
    text = (rep / "REPORT.md").read_text()
    assert "## Table 1" in text and "**Reading:**" in text and "(of 10 comparisons)" in text
    assert text.count("Verdict rule") == 1 and "## Setup" in text and "tinyshakespeare" in text
    missing = text[text.index("## Missing"):]
    for name in ("seeds", "heads", "downstream", "cpt", "cost", "loss_curves", "forest", "mechanism probe"):
        assert name in missing
    assert "table `table1`" not in missing


def test_report_with_everything_present(runs, tmp_path):
    rep = tmp_path / "reports"
    for k in ("table1", "seeds", "heads"):
        make_table(k, runs, rep / k)
    dirs, _ = fx.make_downstream(tmp_path / "ds")
    make_table("downstream", dirs, rep / "downstream", n_resamples=99)
    cdirs, _ = fx.make_cpt(tmp_path / "cp", n=200)
    make_table("cpt", cdirs, rep / "cpt", n_resamples=99)
    make_table("cost", [fx.write_bench(tmp_path / "b.csv")], rep / "cost")
    (rep / "figures").mkdir()
    for name in report.FIGURES:  # report only links images; their content is tested in test_figures
        (rep / "figures" / f"{name}.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (rep / "probe" / "tiny").mkdir(parents=True)  # the workflow's layout: probe/<size>/<variant>.json
    (rep / "probe" / "tiny" / "mhar.json").write_text(json.dumps({"model": "m", "slices": 4, "n_tokens": 10,
                                                                  "kl_trained": 0.3, "kl_null": 0.05,
                                                                  "mean_pairwise_cosine": 0.2}))
    text = report.build_report(rep, rep / "REPORT.md")
    assert "Nothing: every table and figure is present." in text
    assert "](figures/forest.png)" in text and "best H=8 (interior: U-shape)" in text
    assert "trained 0.273 vs null 0.038" in text and "| 0.3000 | 0.0500 | 6.00 |" in text
    assert "(scale not in paper)" in text


# --- pairing checks, run identity, multi-seed downstream, CPT batch check (issue 14 / 18) -----------------------
def test_mismatched_configs_exit_2_naming_both_runs(tmp_path, capsys):
    """A baseline at one config paired with MHAR at another was 'reproduced, p = 0.0005'."""
    paths = []
    for seed in (0, 1, 2):
        paths.append(fx.write_run(tmp_path, "baseline", "100M", seed, 3.03 + 0.01 * seed, overrides=["train.lr=1e-4"]))
        paths.append(fx.write_run(tmp_path, "mhar", "100M", seed, 2.97 + 0.01 * seed, heads=8, label="mhar_h8",
                                  overrides=["train.lr=3e-3"]))
    for kind in ("table1", "seeds", "heads"):
        if kind == "heads":  # H=8 vs H=1 (AttnRes) at another config
            paths += [fx.write_run(tmp_path, "attnres", "100M", s, 3.0, heads=1, overrides=["train.lr=1e-4"])
                      for s in (0, 1, 2)]
        out = tmp_path / kind
        assert tables_main([kind, "--inputs", *map(str, paths), "--out", str(out)]) == 2, kind
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: cannot pair"), err
        assert "train.lr (0.003 vs 0.0001)" in err[0] or "train.lr (0.0001 vs 0.003)" in err[0], err[0]
        assert "mhar_h8" in err[0] and ("baseline" in err[0] or "attnres" in err[0])
        assert not out.with_suffix(".csv").exists()


def test_seed_mismatch_is_an_error_and_the_seed_column_shows_the_paired_seeds(tmp_path, capsys):
    base = [fx.write_run(tmp_path, "baseline", "tiny", s, 4.0 + 0.01 * s) for s in (0, 1, 2)]
    mh = [fx.write_run(tmp_path, "mhar", "tiny", s, 3.95 + 0.01 * s, heads=8, label="mhar_h8") for s in (0, 1)]
    assert tables_main(["table1", "--inputs", *map(str, base + mh), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed sets differ" in err[0] and "[0, 1]" in err[0] and "[0, 1, 2]" in err[0]
    assert "mhar_h8" in err[0] and "baseline" in err[0]
    t = table1(base[:2] + mh)
    row = next(r for r in t.rows if r["variant"] == "mhar")
    assert row["seeds"] == "0 1" and row["n_pairs"] == 2


def test_run_identity_comes_from_the_record_not_the_path(tmp_path):
    """Moving a run folder does not change its table row (summary.json 'run' block)."""
    paths = []
    for seed in (0, 1, 2):
        for variant, heads, tail in (("baseline", None, 3.03), ("mhar", 8, 2.97)):
            label = "mhar_h8" if variant == "mhar" else variant
            where = tmp_path / "moved" / f"x{seed}{variant}"  # a path that says nothing about the run
            paths.append(fx.write_run(tmp_path, variant, "100M", seed, tail + 0.01 * np.sin(seed), heads=heads,
                                      label=label, root_dir=where))
            (where / "config.yaml").unlink()  # the run block alone identifies it
            s = json.loads((where / "summary.json").read_text())
            s["variant"] = "renamed"  # flat keys are not read
            (where / "summary.json").write_text(json.dumps(s))
    t = table1(paths)
    rows = {r["method"]: r for r in t.rows}
    assert set(rows) == {"baseline", "MHAR H=8"} and rows["MHAR H=8"]["seeds"] == "0 1 2"
    ident = json.loads(paths[1].read_text())["run"]
    assert rows["MHAR H=8"]["run_label"] == "mhar_h8" and ident["pairing"] in rows["MHAR H=8"]["pairing"].split(",")


def _eval_of(tmp_path, variant, heads, seed, values, lr="1e-3", task="lambada_openai"):
    label = "mhar_h8" if variant == "mhar" else variant
    _, run, display = fx.run_records(variant, "100M", seed, heads, label, [f"train.lr={lr}"])
    return fx.write_eval(tmp_path / "evals" / f"e{variant}{seed}{lr}", f"results/runs/{label}/model.pt",
                         {task: np.asarray(values, float)}, run=run, display=display)


def test_downstream_b4_c0_is_not_reproduced_by_the_bootstrap_ci(tmp_path):
    """One seed, b=4, c=0 of 200: exact McNemar p = 0.125 decides (was 'reproduced' from the CI)."""
    b = np.zeros(200)
    b[50:100] = 1.0
    a = b.copy()
    a[:4] = 1.0
    dirs = [_eval_of(tmp_path, "baseline", None, 0, b), _eval_of(tmp_path, "mhar", 8, 0, a)]
    t = downstream_table(dirs, n_resamples=1999)
    r = t.rows[0]
    assert r["p"] == pytest.approx(sm_mcnemar(np.array([[50, 4], [0, 146]]), exact=True).pvalue)
    assert r["ci_low"] > 0 and r["verdict"] == vd.NO_DIFFERENCE and r["test"] == "bootstrap CI, exact McNemar p"


def test_downstream_several_seeds_use_the_seed_as_unit(tmp_path):
    rng = np.random.default_rng(3)
    dirs, accs = [], {"baseline": [], "mhar": []}
    for seed in (0, 1, 2):
        u = rng.random(300)
        b = (u < 0.4).astype(float)
        a = (u < 0.4 + 0.05 * (seed - 1) + 0.01).astype(float)  # per-seed gains -0.04, +0.01, +0.06
        dirs += [_eval_of(tmp_path, "baseline", None, seed, b), _eval_of(tmp_path, "mhar", 8, seed, a)]
        accs["baseline"].append(b.mean())
        accs["mhar"].append(a.mean())
    t = downstream_table(dirs, n_resamples=99)
    r = t.rows[0]
    ref = sps.ttest_rel(accs["mhar"], accs["baseline"])
    assert r["p"] == pytest.approx(ref.pvalue) and r["n"] == 3 and r["seeds"] == "0 1 2"
    assert "over 3 seed" in r["test"] and r["verdict"] != vd.REPRODUCED and len(t.rows) == 1


def test_downstream_mismatched_config_or_seeds_exit_2(tmp_path, capsys):
    v = np.r_[np.ones(20), np.zeros(20)]
    dirs = [_eval_of(tmp_path, "baseline", None, 0, v, lr="1e-4"), _eval_of(tmp_path, "mhar", 8, 0, v, lr="3e-3")]
    assert tables_main(["downstream", "--inputs", *map(str, dirs), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(dirs[0]) in err[0] and str(dirs[1]) in err[0] and "train.lr" in err[0]
    dirs2 = [_eval_of(tmp_path, "baseline", None, 0, v), _eval_of(tmp_path, "baseline", None, 1, v),
             _eval_of(tmp_path, "mhar", 8, 0, v)]
    assert tables_main(["downstream", "--inputs", *map(str, dirs2), "--out", str(tmp_path / "d")]) == 2
    assert "seed sets differ" in capsys.readouterr().err


def test_cpt_failed_batch_check_gets_no_verdict(tmp_path):
    dirs, _ = fx.make_cpt(tmp_path, n=300)
    man = tmp_path / "cpt.yaml"
    for identical, judged in ((True, True), (False, False)):
        man.write_text("base: cpt/base\nplain: cpt/plain\nmhar: cpt/mhar\nscale: 8B\n"
                       f"batch_check: {{identical: {str(identical).lower()}, steps: 10}}\n")
        t = cpt_table([man], n_resamples=199)
        r = t.rows[0]
        if judged:
            assert r["verdict"] in (vd.MODELS_DIFFER, vd.NO_DIFFERENCE)  # one run per arm
            assert r["p_holm"] is not None
        else:
            assert r["verdict"] == f"{vd.NOT_JUDGED}: CPT batch check failed" and r.get("p_holm") is None
            assert any("did NOT see identical batches" in n for n in t.notes)


def test_report_setup_comes_from_the_run_records(tmp_path):
    paths = [fx.write_run(tmp_path, v, "100M", s, 3.0 - 0.01 * (v == "mhar") + 0.001 * s, heads=8 if v == "mhar" else None,
                          label="mhar_h8" if v == "mhar" else None) for v in ("baseline", "mhar") for s in (0, 1)]
    for p in paths:
        (p.parent / "provenance.json").write_text(json.dumps(
            {"hardware": {"cpu": "x86", "gpus": [{"name": "NVIDIA H200", "memory_gb": 139}] * 2}}))
    rep = tmp_path / "rep"
    make_table("table1", paths, rep / "table1")
    text = report.build_report(rep, rep / "REPORT.md")
    setup = text[text.index("## Setup"):text.index("## How to read")]
    row = next(ln for ln in setup.splitlines() if ln.startswith("| 100M"))
    s0 = json.loads(paths[0].read_text())
    assert "| 0 1 |" in row and f"| {s0['steps']} |" in row and f"| {s0['tail_k']} |" in row
    assert "tinyshakespeare" in row and "byte" in row and "2x NVIDIA H200" in row
    assert text.index("## Setup") < text.index("## How to read") < text.index("## Table 1")


def test_every_bench_training_variant_is_tabulated_under_its_routing_impl():
    """The cost table groups bench_training rows by routing implementation: each variant mhar_<impl> (the
    benchmark's own list) lands in the row of the routing_impl it ran, not under a name of its own; the variant
    that runs fused without programmatic dependent launch (mhar_fused_nopdl) gets a row of its own."""
    from benchmarks.bench_training import VARIANTS
    for name, spec in VARIANTS.items():
        want = spec.get("routing_impl", "baseline") + ("_nopdl" if name.endswith("_nopdl") else "")
        assert provider_name(name) == want, name
        assert want in ROUTING_ROWS, name  # a variant the benchmark runs today is a row of the table
        assert provider_name(name.upper()) == provider_name(name)


def test_older_records_name_their_rows_as_they_were(tmp_path):
    """A record written before the routing names were unified (no routing_resolved column): its
    mhar_fused_v7_sg8_pdl rows measured what routing_impl fused runs now (the fused row); its mhar_fused rows measured
    withdrawn kernels (a row of their own, fused_v6). A current row (routing_resolved set) keeps its name."""
    old = tmp_path / "old.csv"
    old.write_text("size,variant,tokens_per_s,thr_ratio,status\n1B,baseline,100,,ok\n"
                   "1B,mhar_fused_v7_sg8_pdl,90,0.9,ok\n1B,mhar_fused,85,0.85,ok\n")
    new = tmp_path / "new.csv"
    new.write_text("size,variant,tokens_per_s,thr_ratio,status,routing_resolved\n1B,baseline,100,,ok,\n"
                   "1B,mhar_fused,91,0.91,ok,fused\n")
    df = load_bench([old, new])
    assert list(df["provider"]) == ["baseline", "fused", "fused_v6", "baseline", "fused"]


def test_cost_table_same_run_ratios_are_averaged_over_runs(tmp_path):
    """Records that pair each MHAR run with the baseline of its own run (bench_training.py's thr_ratio): the
    ratio and its SE are the mean and SE over those runs, not a delta method over unpaired baselines (whose
    spread between runs on different days says nothing about the ratio)."""
    rows = ["size,variant,tokens_per_s,peak_mem_gib,status,thr_ratio",
            "1B,baseline,40000,19.0,ok,", "1B,mhar_fused_v7_sg8_pdl,36000,20.0,ok,0.90",  # run 1
            "1B,baseline,20000,19.0,ok,", "1B,mhar_fused_v7_sg8_pdl,18200,20.0,ok,0.91",  # run 2: a slower machine
            "1B,mhar_compile,9000,40.0,ok,"]  # no paired ratio: against the mean baseline
    bench = tmp_path / "training.csv"
    bench.write_text("\n".join(rows) + "\n")
    t = cost_table([bench])
    r = {x["provider"]: x for x in t.rows}
    want = np.array([0.90, 0.91])
    assert r["fused"]["ratio"] == pytest.approx(want.mean())
    assert r["fused"]["ratio_se"] == pytest.approx(want.std(ddof=1) / np.sqrt(2))
    assert r["fused"]["pairing"] == "same run"
    base = np.array([40000, 20000.0])
    assert r["compile"]["ratio"] == pytest.approx(9000 / base.mean()) and r["compile"]["pairing"] == "mean baseline"
    assert r["compile"]["ratio_se"] == pytest.approx((9000 / base.mean()) * (base.std(ddof=1) / np.sqrt(2)) / base.mean())
    assert "| 1B | fused | 2 |" in to_markdown(t) and "same run" in to_markdown(t)
