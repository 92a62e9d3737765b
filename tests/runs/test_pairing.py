"""Pairing on the full identity and the unit of evidence (issue 44.2 / 44.3), with planted cases.

* runs pair only when their resolved configs differ in the residual section alone: baseline data seeds 0,1,2
  against MHAR data seeds 7,8,9 is refused (exit 2, one line naming both runs and the field), in Table 1, the
  seed table, the downstream table and the CPT table (with and without a manifest);
* rows group by the full residual config: hyper_n=2 and hyper_n=4 are two rows, each naming its knob;
* one training seed per arm: the verdict says whether these two models differ, never "reproduced".
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as sps

try:
    import fixtures_analysis as fx
except ImportError:
    from tests import fixtures_analysis as fx
from analysis import report, stats as st, verdict as vd
from analysis.load.runs import load_summaries
from analysis.tables.build import make_table, main as tables_main
from analysis.tables.cpt import cpt_table
from analysis.tables.downstream import downstream_table
from analysis.tables.table1 import table1
from mhar.model.residuals import display_record
from mhar.runs.config import load_run_config, run_identity


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _table1_runs(tmp_path, mhar_overrides=lambda s: [], base_overrides=lambda s: [], seeds=(0, 1, 2)):
    """Baseline and MHAR H=4 runs per seed (run-config overrides as functions of the seed)."""
    paths = []
    for s in seeds:
        shock = 0.02 * np.sin(3.0 * s)
        paths.append(fx.write_run(tmp_path, "baseline", "tiny", s, 4.0 + shock, overrides=base_overrides(s)))
        paths.append(fx.write_run(tmp_path, "mhar", "tiny", s, 3.95 + shock + 0.001 * s, heads=4,
                                  overrides=mhar_overrides(s)))
    return paths


def _data_seed(offset):
    return lambda s: [f"data.seed={s + offset}"]


# --- 44.2: data order --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["table1", "seeds", "heads"])
def test_other_data_seeds_are_not_paired(kind, tmp_path, capsys):
    """Baseline on data seeds 0,1,2, MHAR on 7,8,9 (train seeds 0,1,2 both): was paired and 'reproduced'."""
    paths = _table1_runs(tmp_path, mhar_overrides=_data_seed(7))
    if kind == "heads":  # H=4 against AttnRes (H=1) on the other data order
        paths += [fx.write_run(tmp_path, "attnres", "tiny", s, 3.97) for s in (0, 1, 2)]
    out = tmp_path / kind
    assert tables_main([kind, "--inputs", *map(str, paths), "--out", str(out)]) == 2
    err = _error_line(capsys)
    assert "cannot pair" in err and ("data.seed (7 vs 0)" in err or "data.seed (0 vs 7)" in err), err
    assert "mhar" in err and ("baseline" in err or "attnres" in err)
    assert not out.with_name(out.name + ".csv").exists()


def test_same_data_order_pairs_and_matches_scipy(tmp_path):
    paths = _table1_runs(tmp_path, mhar_overrides=_data_seed(7), base_overrides=_data_seed(7))
    t = table1(paths)
    row = next(r for r in t.rows if r["variant"] == "mhar")
    runs = {(r.variant, r.seed): r.tail_mean_val_loss for r in load_summaries(paths)}
    a = [runs[("mhar", s)] for s in (0, 1, 2)]
    b = [runs[("baseline", s)] for s in (0, 1, 2)]
    assert row["p"] == pytest.approx(sps.ttest_rel(a, b).pvalue) and row["seeds"] == "0 1 2"


@pytest.mark.parametrize("field, override, shown", [
    ("data.corpus", "data.corpus=nltk_gutenberg", "'tinyshakespeare'"), ("data.seq_len", "data.seq_len=64", "128"),
    ("train.steps", "train.steps=300", "200"), ("data.tokenizer", "data.tokenizer=gpt2", "'byte'")])
def test_data_order_and_schedule_fields_are_named(field, override, shown, tmp_path, capsys):
    paths = _table1_runs(tmp_path, mhar_overrides=lambda s: [override])
    assert tables_main(["table1", "--inputs", *map(str, paths), "--out", str(tmp_path / "t")]) == 2
    err = _error_line(capsys)
    assert f"{field} (" in err and shown in err, err


def test_execution_choices_do_not_break_pairing(tmp_path):
    """routing_impl, compile, device, micro_batch, threads: the same run identity, paired as before."""
    paths = _table1_runs(tmp_path, mhar_overrides=lambda s: [
        "model.residual.routing_impl=compile", "train.compile=false", "train.device=cpu", "train.micro_batch=8",
        "train.threads=2"])
    t = table1(paths)
    assert next(r for r in t.rows if r["variant"] == "mhar")["n_pairs"] == 3


def test_a_row_pools_only_seeds_of_one_config(tmp_path, capsys):
    """Within a row (one residual config) the seeds' runs must share the rest of the config."""
    paths = _table1_runs(tmp_path)
    extra = fx.write_run(tmp_path, "mhar", "tiny", 3, 3.9, heads=4, overrides=["train.lr=5e-3"])
    base3 = fx.write_run(tmp_path, "baseline", "tiny", 3, 4.0, overrides=["train.lr=5e-3"])
    assert tables_main(["table1", "--inputs", *map(str, paths + [extra, base3]), "--out", str(tmp_path / "t")]) == 2
    err = _error_line(capsys)
    assert "one row" in err and "train.lr" in err


# --- 44.2: residual knobs ------------------------------------------------------------------------------------
def test_two_hyper_n_values_are_two_rows_with_their_knobs(tmp_path):
    """hyper_n=2 and hyper_n=4 were one row ('hyper-conn'), or an error about two runs of one seed."""
    paths = []
    for s in (0, 1, 2):
        shock = 0.02 * np.sin(3.0 * s)
        paths.append(fx.write_run(tmp_path, "baseline", "tiny", s, 4.0 + shock))
        paths.append(fx.write_run(tmp_path, "hyper", "tiny", s, 3.99 + shock + 0.001 * s, label="hyper_n2",
                                  overrides=["model.residual.hyper_n=2"]))
        paths.append(fx.write_run(tmp_path, "hyper", "tiny", s, 3.97 + shock - 0.001 * s, label="hyper_n4",
                                  overrides=["model.residual.hyper_n=4"]))
    for kind in ("table1", "seeds"):
        t = make_table(kind, paths, tmp_path / kind)
        df = pd.read_csv(t[0])
        hyper = df[df["variant"] == "hyper"].set_index("method")
        assert set(hyper.index) == {"hyper-conn (hyper_n=2)", "hyper-conn (hyper_n=4)"}, list(df["method"])
        assert set(hyper["residual"]) == {"hyper_n=2", "hyper_n=4"}
        assert hyper.loc["hyper-conn (hyper_n=2)", "delta"] == pytest.approx(-0.01 + 0.001, abs=1e-3)
        assert hyper.loc["hyper-conn (hyper_n=4)", "delta"] == pytest.approx(-0.03 - 0.001, abs=1e-3)
        assert "hyper-conn (hyper_n=2)" in t[1].read_text()


def test_disjoint_seeds_of_two_knob_values_are_not_pooled(tmp_path, capsys):
    """hyper_n=2 on seeds 0,1 and hyper_n=4 on seed 2 were pooled into one 3-seed row against the baseline."""
    paths = [fx.write_run(tmp_path, "baseline", "tiny", s, 4.0) for s in (0, 1, 2)]
    paths += [fx.write_run(tmp_path, "hyper", "tiny", s, 3.9 - 0.01 * s, overrides=["model.residual.hyper_n=2"])
              for s in (0, 1)]
    paths.append(fx.write_run(tmp_path, "hyper", "tiny", 2, 3.9, overrides=["model.residual.hyper_n=4"]))
    assert tables_main(["table1", "--inputs", *map(str, paths), "--out", str(tmp_path / "t")]) == 2
    err = _error_line(capsys)
    assert "seed sets differ" in err and "hyper" in err and "[0, 1, 2]" in err


# --- downstream ---------------------------------------------------------------------------------------------
def _eval(tmp_path, variant, seed, values, heads=None, overrides=(), task="lambada_openai"):
    label = f"{variant}_h{heads}" if heads else variant
    cfg = fx.run_config(variant, "100M", seed, heads, label, overrides)
    run = run_identity(cfg)
    d = tmp_path / "evals" / f"{label}-{seed}-{run['identity'][:6]}"
    return fx.write_eval(d, f"/r/runs/{label}/model.pt", {task: np.asarray(values, float)}, run=run,
                         display=display_record(variant))


def test_downstream_refuses_other_data_seeds(tmp_path, capsys):
    v = np.r_[np.ones(30), np.zeros(30)]
    dirs = [_eval(tmp_path, "baseline", 0, v), _eval(tmp_path, "mhar", 0, v, heads=8, overrides=["data.seed=7"])]
    assert tables_main(["downstream", "--inputs", *map(str, dirs), "--out", str(tmp_path / "d")]) == 2
    err = _error_line(capsys)
    assert str(dirs[0]) in err and str(dirs[1]) in err and "data.seed" in err


def test_downstream_rows_by_full_residual_config(tmp_path):
    rng = np.random.default_rng(0)
    b = (rng.random(200) < 0.4).astype(float)
    dirs = [_eval(tmp_path, "baseline", 0, b),
            _eval(tmp_path, "mhar", 0, np.maximum(b, rng.random(200) < 0.2), heads=8),
            _eval(tmp_path, "mhar", 0, b, heads=8, overrides=["model.residual.routing_eps=1e-5"])]
    t = downstream_table(dirs, n_resamples=99)
    assert sorted(r["method"] for r in t.rows) == ["MHAR H=8 (routing_eps=1e-05)", "MHAR H=8 (routing_eps=1e-06)"]


# --- 44.3: the unit of evidence ------------------------------------------------------------------------------
def test_one_seed_downstream_says_models_differ_never_reproduced(tmp_path):
    """2,000 questions, one trained model per arm, a planted +0.1 gain in the paper's direction at its own scale:
    was 'reproduced'; the question-level test only shows that these two models differ."""
    rng = np.random.default_rng(1)
    u = rng.random(2000)
    b, a = (u < 0.3).astype(float), (u < 0.3 + 0.024).astype(float)  # exactly the paper's +0.024 gain
    dirs = [_eval(tmp_path, "baseline", 0, b), _eval(tmp_path, "mhar", 0, a, heads=8)]
    t = downstream_table(dirs, n_resamples=499)
    r = t.rows[0]
    bb, cc = st.discordant_counts(a, b)
    assert r["p"] == pytest.approx(sps.binomtest(bb, bb + cc, 0.5).pvalue)  # exact McNemar, as before
    assert r["p"] < 0.001 and r["ci_low"] <= r["published_delta"] <= r["ci_high"]  # would have been 'reproduced'
    assert r["verdict"] == vd.MODELS_DIFFER and r["judged"] == vd.SINGLE_SEED_JUDGED and r["n_seeds"] == 1
    b2 = b.copy()
    b2[:3] = 1 - b2[:3]  # 3 discordant questions: no detectable difference
    close = [_eval(tmp_path / "s", "baseline", 0, b), _eval(tmp_path / "s", "mhar", 0, b2, heads=8)]
    assert downstream_table(close, n_resamples=99).rows[0]["verdict"] == vd.NO_DIFFERENCE


def test_several_seeds_keep_the_seed_level_words(tmp_path):
    rng = np.random.default_rng(2)
    dirs = []
    for seed in (0, 1, 2):
        u = rng.random(400)
        dirs += [_eval(tmp_path, "baseline", seed, u < 0.3), _eval(tmp_path, "mhar", seed, u < 0.3 + 0.024, heads=8)]
    r = downstream_table(dirs, n_resamples=99).rows[0]
    assert r["n_seeds"] == 3 and "over 3 seed" in r["test"] and "single seed" not in r["verdict"]
    assert r["verdict"] == vd.decide(st.PairedResult(r["delta"], r["ci_low"], r["ci_high"], r["p"], 3, "t"),
                                     r["published_delta"], r["same_scale"], r["p_holm"])


def test_decide_single_seed_rule():
    r = st.PairedResult(0.05, 0.02, 0.08, 0.001, 2000, "McNemar")
    assert vd.decide(r, 0.05, True) == vd.REPRODUCED  # the seed-level reading of the same numbers
    assert vd.decide(r, 0.05, True, single_seed=True) == vd.MODELS_DIFFER
    assert vd.decide(r, None, True, single_seed=True) == vd.MODELS_DIFFER  # about the models, not the paper
    assert vd.decide(r, -0.05, False, p_adjusted=0.2, single_seed=True) == vd.NO_DIFFERENCE
    assert vd.decide(st.PairedResult(0.0, 0.0, 0.0, 1.0, 2000, "McNemar"), 0.05, True,
                     single_seed=True) == vd.INSUFFICIENT
    single = [ln for ln in vd.VERDICT_RULE.splitlines() if vd.MODELS_DIFFER in ln]
    assert len(single) == 1 and vd.NO_DIFFERENCE in single[0] and vd.REPRODUCED not in single[0]


# --- CPT arms -------------------------------------------------------------------------------------------------
def _cpt_dirs(tmp_path, plain_over=(), mhar_over=(), n=400):
    """base / plain / mhar eval dirs; the arms carry the run records mhar.train writes for CPT arms."""
    rng = np.random.default_rng(5)
    u = rng.random(n)
    common = ["model.preset=debug", "train.steps=40", "train.log_batch_hash=true"]
    arms = {}
    delta = ["model.residual.delta_block_layers=1"]  # the debug preset has 2 layers
    for arm, variant, over, p in (("plain", "baseline", plain_over, 0.3),
                                  ("mhar", "mhar_delta", [*delta, *mhar_over], 0.34)):
        cfg = load_run_config(None, common + [f"model.residual.variant={variant}", f"meta.name=cpt_{arm}",
                                              f"train.init_from=/r/cpt/init/{arm}/model.pt", *over])
        arms[arm] = (run_identity(cfg), display_record(variant), (u < p).astype(float))
    dirs = [fx.write_eval(tmp_path / "cpt" / "base", "hf:/models/base", {"gsm8k": (u < 0.2).astype(float)},
                          metric="exact_match,strict-match")]
    for arm, (run, display, v) in arms.items():
        dirs.append(fx.write_eval(tmp_path / "cpt" / arm, f"/r/cpt/runs/{arm}/model.pt", {"gsm8k": v},
                                  metric="exact_match,strict-match", run=run, display=display))
    return dirs


@pytest.mark.parametrize("over, field", [(["data.seed=7"], "data.seed"), (["train.steps=80"], "train.steps"),
                                         (["data.corpus=nltk_gutenberg"], "data.corpus")])
def test_cpt_arms_with_other_data_order_or_schedule_are_refused(over, field, tmp_path, capsys):
    dirs = _cpt_dirs(tmp_path, mhar_over=over)
    assert tables_main(["cpt", "--inputs", *map(str, dirs), "--out", str(tmp_path / "c")]) == 2  # no manifest
    err = _error_line(capsys)
    assert f"{field} (" in err and str(dirs[1]) in err and str(dirs[2]) in err and "cpt_plain" in err, err
    man = tmp_path / "cpt.yaml"
    man.write_text("base: cpt/base\nplain: cpt/plain\nmhar: cpt/mhar\nscale: 8B\nbatch_check: {identical: true}\n")
    assert tables_main(["cpt", "--inputs", str(man), "--out", str(tmp_path / "c")]) == 2  # with one
    assert f"{field} (" in _error_line(capsys)


def test_cpt_arms_of_one_schedule_are_paired_and_judged_as_two_models(tmp_path):
    dirs = _cpt_dirs(tmp_path)
    t = cpt_table(dirs, n_resamples=199)
    r = t.rows[0]
    assert r["verdict"] in (vd.MODELS_DIFFER, vd.NO_DIFFERENCE) and r["judged"] == vd.SINGLE_SEED_JUDGED
    assert not any("not checked" in n for n in t.notes)
    # arms evaluated from models that record no run: the table says the pairing was not checked
    t2 = cpt_table(fx.make_cpt(tmp_path / "hf", n=200)[0], n_resamples=99)
    assert any("was not checked" in n for n in t2.notes)


def test_report_says_the_papers_cpt_evidence_is_single_run(tmp_path):
    rep = tmp_path / "rep"
    make_table("cpt", _cpt_dirs(tmp_path), rep / "cpt", n_resamples=99)
    text = report.build_report(rep, rep / "REPORT.md")
    cpt = text[text.index("## Continued pretraining"):]
    assert "Table 3" in cpt and "one run per arm" in cpt and "McNemar" in cpt
    assert text.count("Verdict rule") == 1 and vd.MODELS_DIFFER in text
    assert cpt.index("Unit of evidence") < cpt.index("| task / metric")


def test_records_of_earlier_shapes_are_refused_naming_the_script(tmp_path, capsys):
    """Summaries written before run.config (flat config_hash, config.yaml beside them) and eval records that
    carry a config_hash instead of run.config no longer pair through a second rule: the tables refuse them with
    one line naming the record and the script that converts them."""
    paths = _table1_runs(tmp_path)
    old_summary = json.loads(Path(paths[0]).read_text())
    old_summary = {**{k: v for k, v in old_summary.items() if k not in ("run", "display")}, "config_hash": "aaa"}
    Path(paths[0]).write_text(json.dumps(old_summary))
    assert tables_main(["table1", "--inputs", *map(str, paths), "--out", str(tmp_path / "t")]) == 2
    err = _error_line(capsys)
    assert str(paths[0]) in err and "scripts/migrate_records.py" in err
    v = np.r_[np.ones(20), np.zeros(20)]
    old = {"label": "baseline", "residual": {"variant": "baseline", "heads": 1}, "size": "100M", "seed": 0,
           "data_seed": 0, "config_hash": "aaa"}
    a = fx.write_eval(tmp_path / "o" / "a", "x", {"lambada_openai": v}, run=old, display=display_record("baseline"))
    new = _eval(tmp_path, "mhar", 0, v, heads=8)
    assert tables_main(["downstream", "--inputs", str(a), str(new), "--out", str(tmp_path / "d")]) == 2
    err = _error_line(capsys)
    assert str(a / "lambada_openai" / "results.json") in err and "scripts/migrate_records.py" in err


def test_released_arms_pair_by_their_declared_pairing(tmp_path, capsys):
    """Released checkpoints (never trained here: no run.config) pair as their run blocks declare (run.pairing
    "released-<group>", as workflow/scripts/import_released.py writes it): one group pairs, two groups do not."""
    v = np.r_[np.ones(20), np.zeros(20)]
    arm = lambda label, variant, group: {"label": label, "residual": {"variant": variant, "heads": 4},  # noqa
                                         "size": "rel", "seed": 0,
                                         "data_seed": None, "pairing": f"released-{group}",
                                         "identity": f"released:/hf/{label}", "released": f"/hf/{label}"}
    w = lambda name, variant, group: fx.write_eval(tmp_path / name, "x", {"lambada_openai": v},  # noqa
                                                   run=arm(name, variant, group), display=display_record(variant))
    base, mh, other = w("rel_base", "baseline", "g"), w("rel_mhar", "mhar", "g"), w("rel_other", "mhar", "h")
    assert len(downstream_table([base, mh], n_resamples=99).rows) == 1
    assert tables_main(["downstream", "--inputs", str(base), str(other), "--out", str(tmp_path / "d")]) == 2
    assert "pairing ('released-h' vs 'released-g')" in _error_line(capsys)
    # a run trained here never pairs with a released arm of its size and seed
    rel = fx.write_eval(tmp_path / "rel_100m", "x", {"lambada_openai": v}, display=display_record("baseline"),
                        run={**arm("rel_100m", "baseline", "g"), "size": "100M"})
    trained = _eval(tmp_path, "mhar", 0, v, heads=4)
    assert tables_main(["downstream", "--inputs", str(rel), str(trained), "--out", str(tmp_path / "d")]) == 2
    err = _error_line(capsys)
    assert "a released checkpoint" in err and str(rel) in err
