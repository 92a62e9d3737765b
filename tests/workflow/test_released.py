"""The released-models target (config/released.yaml, reproduce_released, analysis/tables/released.py).

* the dry run of the overlay plans one import per released arm, one evaluation per arm and task, one table;
* a local `hf:` path that does not exist, or a `published:` choice that names no published row, stops the
  dry run with one `error:` line (nothing runs);
* a hub repository that cannot be reached stops the import job with one `error:` line naming the repository and
  how to give a local copy (the hub client runs offline here: HF_HUB_OFFLINE=1, an empty cache);
* end to end on the CPU: the overlay's 0.6B pair with test-built local checkpoints in place of the hub names
  (a stock Qwen3 baseline, a block-mode checkpoint in the authors' released layout), tiny evaluation subsets: the
  released table carries our numbers, the README's published numbers with their source id and commit, what the
  paper draft says instead, and the paired per-question test; the provenance records each folder's content hash;
* the table's pieces against hand-made records: published rows by source, disagreements between sources,
  the paired test and Holm's adjustment (analysis.verdict), and the refusals.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import fixtures_analysis as fx  # noqa: E402
from test_workflow import REPO, bench_standins, configfiles, job_counts, load, snakemake  # noqa: E402

from analysis.tables import released as rel  # noqa: E402
from analysis.tables.registry import TABLES  # noqa: E402
from analysis.tables.build import main as tables_main  # noqa: E402
from analysis import verdict as vd  # noqa: E402
from analysis.load.common import AnalysisInputError  # noqa: E402

OVERLAY = "config/released.yaml"


def _error_lines(res) -> list[str]:
    return [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("error:")]


def _overlay(tmp_path: Path, arms: dict, name: str = "overlay.yaml", **extra) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"released": arms, **extra}))
    return p


# --- planning ---------------------------------------------------------------------------------------------
def test_dry_run_plans_import_evaluation_and_table(tmp_path):
    cfg = load(OVERLAY)
    res = snakemake(["reproduce_released", "-n", *configfiles(OVERLAY)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    counts = job_counts(res.stdout)
    arms, tasks = cfg["released"], load("config/config.yaml")["downstream"]["tasks"]  # the overlaid config's tasks
    assert "tasks" not in cfg["downstream"]
    assert {"wikitext", "lambada_openai", "hellaswag"} <= set(tasks)
    assert counts == {"import_released": len(arms), "evaluate_released": len(arms) * len(tasks),
                      "table": 1, "reproduce_released": 1}
    assert {a["hf"] for a in arms.values()} == {
        "wdlctc/open-attnres-baseline", "wdlctc/open-attnres-block", "wdlctc/open-attnres-0.6b-baseline",
        "wdlctc/open-attnres-0.6b-block", "Qwen/Qwen3-0.6B"}
    assert f"{cfg['reports_dir']}/released.md" in res.stdout  # its own reports folder, never reports/
    rel.check_choices(arms)  # every arm names published rows that exist


def test_the_overlay_names_its_target_and_the_issue_command_plans_it(tmp_path):
    """`snakemake -n --configfile config/released.yaml reproduce_released`, typed from the repository root as the
    README says: Snakemake's --configfile swallows the target name as a second config file, which is the one-key
    overlay ./reproduce_released naming the same target; the overlay alone (no target) plans it too, and the
    default target stays `all` without it."""
    arms, tasks = load(OVERLAY)["released"], load("config/config.yaml")["downstream"]["tasks"]
    want = {"import_released": len(arms), "evaluate_released": len(arms) * len(tasks), "table": 1,
            "reproduce_released": 1}
    for args in (["--configfile", OVERLAY, "reproduce_released"], ["--configfile", OVERLAY]):
        res = snakemake(["-n", *args], tmp_path, cwd=REPO)  # relative paths, read from the repository root
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert job_counts(res.stdout) == want, args
    assert load("reproduce_released") == {"target": "reproduce_released"}
    bench_standins(tmp_path)
    res = snakemake(["-n", *configfiles("config/ci.yaml")], tmp_path)  # no overlay naming a target: `all`
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    counts = job_counts(res.stdout)
    assert counts.get("all") == 1 and "reproduce_released" not in counts


def test_missing_local_folder_or_unknown_source_is_refused_when_planning(tmp_path):
    missing = tmp_path / "nowhere"
    bad = _overlay(tmp_path, {"x": {"hf": str(missing)}})
    res = snakemake(["reproduce_released", "-n", *configfiles(OVERLAY), str(bad)], tmp_path)
    assert res.returncode != 0
    assert _error_lines(res) == [f"error: released.x.hf: local path {str(missing)!r} does not exist; give a "
                                 "Hugging Face model folder or a hub name org/name"]
    assert "import_released" not in res.stdout  # nothing planned, nothing run
    wrong = _overlay(tmp_path, {"oar-0.6b-block": {"published": {"source": "oar-readme-9b", "scale": "0.6B",
                                                                 "method": "block"}}}, "wrong.yaml")
    res = snakemake(["reproduce_released", "-n", *configfiles(OVERLAY), str(wrong)], tmp_path)
    assert res.returncode != 0
    (line,) = _error_lines(res)
    assert "'oar-0.6b-block'" in line and "'oar-readme-9b'" in line and "oar-readme-0.6b 0.6B block" in line


def test_unreachable_hub_stops_the_import_with_one_error_line(tmp_path):
    over = _overlay(tmp_path, {"gone": {"hf": "wdlctc/open-attnres-0.6b-block", "size": "s", "group": "g"}})
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    res = snakemake(["results/released/gone/model.pt", "--cores", "1", *configfiles("config/ci.yaml"), str(over)],
                    tmp_path, env)
    assert res.returncode != 0
    (line,) = _error_lines(res)
    assert "'wdlctc/open-attnres-0.6b-block'" in line and "could not be reached" in line
    assert "released: {gone: {hf: /absolute/DIR}}" in line
    assert "hf download wdlctc/open-attnres-0.6b-block --local-dir DIR" in line
    assert not (tmp_path / "results/released/gone/model.pt").exists()


# --- end to end on the CPU ----------------------------------------------------------------------------------
def _checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """A stock Qwen3 folder (the baseline) and a block-mode checkpoint in the authors' released layout (recency
    bias, gates), both with the byte vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'hf'))  # the builder lives beside its own tests
    from test_hf_released_layout import released_checkpoint

    torch.manual_seed(0)
    base = tmp_path / "ckpt" / "baseline"
    Qwen3ForCausalLM(Qwen3Config(vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 max_position_embeddings=256, tie_word_embeddings=True)).save_pretrained(base)
    block = tmp_path / "ckpt" / "block"
    released_checkpoint(block, "block", layers=2, num_blocks=2, extra_config={"max_position_embeddings": 256})
    return base, block


def test_released_target_end_to_end_with_local_checkpoints(tmp_path):
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not all(Path(data, t).is_dir() for t in ("lambada_openai", "hellaswag")):
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with lambada_openai/, hellaswag/)")
    base, block = _checkpoints(tmp_path)
    cfg = load(OVERLAY)
    arms = {k: dict(cfg["released"][k], tokenizer="byte") for k in ("oar-0.6b-baseline", "oar-0.6b-block")}
    arms["oar-0.6b-baseline"]["hf"], arms["oar-0.6b-block"]["hf"] = str(base), str(block)
    over = _overlay(tmp_path, arms, reports_dir=cfg["reports_dir"],
                    downstream={"tasks": ["lambada_openai", "hellaswag"], "subset": "first:4", "device": "cpu",
                                "bootstrap_iters": 0}, stats={"resamples": 199})
    # the defaults, then these arms (a mapping merges: config/released.yaml on top would add its hub arms)
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    res = snakemake(["reproduce_released", "--cores", "2", *configfiles(str(over))], tmp_path, env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    out = tmp_path / cfg["reports_dir"]
    rows = list(csv.DictReader((out / "released.csv").open()))
    assert {(r["arm"], r["task"]) for r in rows} == {(a, t) for a in arms for t in ("lambada_openai", "hellaswag")}
    got = {(r["arm"], r["task"]): r for r in rows}
    # published numbers of the README at the commit read, with their source id
    assert float(got["oar-0.6b-baseline", "hellaswag"]["published"]) == 0.325
    assert float(got["oar-0.6b-block", "lambada_openai"]["published"]) == 0.114
    assert {r["published_source"] for r in rows} == {"oar-readme-0.6b"}
    # where the paper draft disagrees, the row says so
    other = got["oar-0.6b-block", "lambada_openai"]["published_others"]
    assert "oar-draft-0.6b: 0.092 (differs)" in other and "oar-draft-0.6b gives 0.114 to delta" in other
    # the block arm is compared with the baseline arm, paired by question, Holm across the two tasks
    cmp = [got["oar-0.6b-block", t] for t in ("lambada_openai", "hellaswag")]
    assert all(r["reference"] == "oar-0.6b-baseline" and r["test"] and r["verdict"] for r in cmp)
    assert float(cmp[0]["published_delta"]) == pytest.approx(0.114 - 0.082)
    assert {r["published_commit"] for r in rows} == {"83d2b8de82c2fbb981c7decca67d13d9db348da6"}
    md = (out / "released.md").read_text()
    assert TABLES["released"].title in md and "README.md @ 83d2b8de82c2fbb981c7decca67d13d9db348da6" in md and "main.tex @" in md
    # each arm is pinned: a local folder by the hash of its config and weights; the block arm is the authors' layout
    prov = json.loads((tmp_path / "results/released/oar-0.6b-block/provenance.json").read_text())
    from mhar.hf.importer import content_sha256
    from mhar.atomic import file_sha256

    want = content_sha256(block, {"model.safetensors": file_sha256(block / "model.safetensors")})
    assert prov["source"] == {"kind": "local", "folder": str(block.resolve()), "commit": None, "content_sha256": want}
    assert prov["import_hf"]["variant"] == got["oar-0.6b-block", "hellaswag"]["variant"] != "baseline"
    assert got["oar-0.6b-block", "hellaswag"]["checkpoint"] == f"local block (content {want[:12]})"


# --- the table's pieces against hand-made records -------------------------------------------------------------
def _arm_eval(tmp_path: Path, label: str, variant: str, values: dict, group: str = "g", size: str = "0.6B-oar"):
    run = {"label": label, "residual": {"variant": variant, "heads": 1}, "size": size, "seed": 0,
           "data_seed": None, "pairing": f"released-{group}", "identity": f"released:/hf/{label}",
           "released": f"/hf/{label}", "source": {"kind": "hub", "repo": f"org/{label}", "commit": "ab" * 20}}
    from mhar.model.residuals import display_record  # what eval.run records beside the run block

    return fx.write_eval(tmp_path / label, "x", values, run=run, display=display_record(variant))


ARMS = {"base": {"published": {"source": "oar-readme-0.6b", "scale": "0.6B", "method": "baseline"}},
        "block": {"published": {"source": "oar-readme-0.6b", "scale": "0.6B", "method": "block"}}}


def test_table_pairs_block_with_baseline_and_quotes_each_source(tmp_path):
    rng = np.random.default_rng(0)
    a = (rng.random(300) < 0.5).astype(float)
    a[:40] = 0.0
    b = a.copy()
    b[:40] = 1.0  # 40 discordant questions, all one way: the block arm is right where the baseline is wrong
    hs_a, hs_b = (rng.random(300) < 0.3).astype(float), (rng.random(300) < 0.3).astype(float)
    words = rng.integers(100, 600, 60).astype(float)
    ll_a = rng.normal(-4.0, 0.2, 60) * words
    ll_b = ll_a + rng.normal(0.1, 0.05, 60) * words  # higher log-likelihood: lower perplexity
    base = _arm_eval(tmp_path, "base", "baseline", {"lambada_openai": a, "hellaswag": hs_a, "wikitext": (ll_a, words)})
    block = _arm_eval(tmp_path, "block", "block_attnres",
                      {"lambada_openai": b, "hellaswag": hs_b, "wikitext": (ll_b, words)})
    t = rel.released_table([base, block], ARMS, n_resamples=199)
    rows = {(r["arm"], r["task"]): r for r in t.rows}
    r = rows["block", "lambada_openai"]
    assert r["ours"] == pytest.approx(b.mean()) and rows["base", "lambada_openai"]["ours"] == pytest.approx(a.mean())
    assert r["published"] == 0.114 and r["published_source"] == "oar-readme-0.6b"
    assert r["published_delta"] == pytest.approx(0.114 - 0.082)
    # the same evidence analysis.verdict gives, and Holm over the three comparison rows
    ev = vd.question_evidence(b, a, n_resamples=199)
    assert r["delta"] == pytest.approx(ev.estimate) and r["p"] == pytest.approx(ev.p_value)
    ev_h = vd.question_evidence(hs_b, hs_a, n_resamples=199)
    ev_w = vd.perplexity_evidence(ll_b, ll_a, words, words, n_resamples=199)
    w = rows["block", "wikitext"]
    assert w["metric"] == "word_perplexity" and w["ours"] == pytest.approx(np.exp(-ll_b.sum() / words.sum()))
    assert w["delta"] == pytest.approx(ev_w.estimate) and w["delta"] < 0
    assert w["published_delta"] == pytest.approx(55.69 - 60.21)
    assert [r["p_holm"], rows["block", "hellaswag"]["p_holm"], w["p_holm"]] == pytest.approx(
        vd.holm([ev.p_value, ev_h.p_value, ev_w.p_value]))
    assert w["published_others"] == "oar-draft-0.6b: 54.08 (differs); oar-draft-0.6b gives 55.69 to delta"
    assert r["verdict"] == vd.MODELS_DIFFER and r["sign_vs_published"] == "same sign"
    assert rows["base", "lambada_openai"]["delta"] is None  # the reference itself is not tested
    # sources: the README's findings give LAMBADA 0.114 to full, the draft to delta, and its block row differs
    assert r["published_others"] == ("oar-readme-findings gives 0.114 to full; oar-draft-0.6b: 0.092 (differs); "
                                  "oar-draft-0.6b gives 0.114 to delta")
    assert rows["base", "lambada_openai"]["published_others"] == "oar-draft-0.6b: 0.082 (agrees)"
    assert rows["block", "hellaswag"]["checkpoint"] == "org/block@" + "ab" * 6
    notes = "\n".join(t.notes)
    for s in ("oar-readme-0.6b", "oar-readme-findings", "oar-draft-0.6b"):
        assert s in notes
    # switching the source switches the published column
    arms = {**ARMS, "block": {"published": {"source": "oar-draft-0.6b", "scale": "0.6B", "method": "block"}}}
    r2 = {(x["arm"], x["task"]): x for x in rel.released_table([base, block], arms, n_resamples=199).rows}
    assert r2["block", "lambada_openai"]["published"] == 0.092
    assert r2["block", "lambada_openai"]["published_delta"] == pytest.approx(0.092 - 0.082)


def test_table_refuses_unknown_sources_and_ambiguous_pairs(tmp_path, capsys):
    v = np.r_[np.ones(10), np.zeros(10)]
    base = _arm_eval(tmp_path, "base", "baseline", {"lambada_openai": v})
    block = _arm_eval(tmp_path, "block", "block_attnres", {"lambada_openai": v})
    arms_file = tmp_path / "arms.json"
    arms_file.write_text(json.dumps({"block": {"published": {"source": "nope", "scale": "0.6B", "method": "block"}}}))
    assert tables_main(["released", "--inputs", str(base), str(block), "--arms", str(arms_file), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: released arm 'block': no published numbers for source 'nope'")
    other = _arm_eval(tmp_path, "base2", "baseline", {"lambada_openai": v})
    with pytest.raises(AnalysisInputError, match="pairs with 2 baseline arms"):
        rel.released_table([base, other, block], {}, n_resamples=99)
    # another group does not pair: the block arm is shown, not compared
    lone = _arm_eval(tmp_path, "lone", "block_attnres", {"lambada_openai": v}, group="h")
    t = rel.released_table([base, lone], {}, n_resamples=99)
    assert all(r["delta"] is None for r in t.rows) and any("not compared: lone" in n for n in t.notes)


def test_published_file_names_a_commit_for_every_number():
    pub = rel.load_published()
    assert pub and all(len(p.commit) == 40 and p.repository and p.file and p.section for p in pub)
    by = {(p.source, p.method, p.task): p.value for p in pub}
    # the issue's numbers (README, 0.6B, 20k steps) and the draft's attribution of them
    assert [by["oar-readme-0.6b", m, t] for m in ("baseline", "block")
            for t in ("", "wikitext", "lambada_openai", "hellaswag")] == [3.303, 60.21, 0.082, 0.325,
                                                                          3.35, 55.69, 0.114, 0.34]
    assert by["oar-draft-0.6b", "delta", "wikitext"] == 55.69 and by["oar-draft-0.6b", "full", "wikitext"] == 68.87
    assert {p.commit for p in pub if p.file == "README.md"} == {"83d2b8de82c2fbb981c7decca67d13d9db348da6",
                                                                "9d5a73e3afdbf85b9063345bb722a5e428938e9e"}
