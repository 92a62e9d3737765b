"""Continued-pretraining table: CPT gain, total gain and MHAR gain (difference-in-differences) per task, and
the pairing check of the two CPT arms."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from .. import verdict as vd
from ..load.common import AnalysisInputError, read_json, read_yaml
from mhar.runs.sidecar import provenance
from ..load.published import check_source, load_published, published_value, source_notes
from ..load.runs import identify_eval
from ..load.samples import align, eval_tasks, load_eval_task
from .pairs import check_pair, judge
from .questions import compare_task, primary_metric
from .render import Column, JUDGE_COLS, P_COLS, RULE_POINTER, Table, f_ci, f_num, f_p, is_number, paired_cols
from .registry import TABLES, Build


def _cpt_inputs(inputs: Sequence[str | Path]) -> tuple[Path, Path, Path, Optional[str], Optional[dict]]:
    """(base, plain, mhar eval dirs, scale, batch check) from three dirs or a manifest."""
    if len(inputs) == 3:
        return Path(inputs[0]), Path(inputs[1]), Path(inputs[2]), None, None
    if len(inputs) == 1 and Path(inputs[0]).is_file():
        m = read_yaml(inputs[0]) or {}  # safe: a python tag is refused, never executed
        for k in ("base", "plain", "mhar"):
            if not isinstance(m, dict) or k not in m:
                raise AnalysisInputError(f"{inputs[0]}: CPT manifest needs keys base, plain, mhar (eval dirs)")
        root = Path(inputs[0]).parent
        rel = lambda p: Path(p) if Path(p).is_absolute() else root / p  # noqa: E731
        return rel(m["base"]), rel(m["plain"]), rel(m["mhar"]), m.get("scale"), m.get("batch_check")
    raise AnalysisInputError("cpt takes three eval dirs (base plain mhar) or one manifest file")


def batch_check_passed(batch_check: Optional[dict]) -> Optional[bool]:
    """True / False from a CPT batch check record ({identical: bool, ...}); None when there is none."""
    if batch_check is None:
        return None
    return isinstance(batch_check, dict) and batch_check.get("identical") is True


# What the two CPT arms may differ in besides the residual section (mhar.runs.pairing.PAIRING_VARIES): each starts
# from its own conversion of the base (init/plain vs init/mhar).
ARM_VARIES = ("train.init_from",)


def check_arms(plain_eval: str | Path, mhar_eval: str | Path) -> Optional[str]:
    """Refuse (AnalysisInputError, one line naming both runs and the first field that differs) CPT arms whose
    training differs in more than the residual form: data order (seeds, corpus, tokenizer, sequence length) or
    schedule. Returns a note when the records cannot say (an arm evaluated from a model that records no run,
    e.g. a Hugging Face checkpoint); None when checked."""
    infos = []
    for d in (plain_eval, mhar_eval):
        rps = sorted(Path(d).glob("*/results.json"))
        rec = read_json(rps[0]) if rps else None
        if not (isinstance(rec, dict) and isinstance(rec.get("run"), dict)):
            return (f"the pairing of the CPT arms was not checked: {d} records no training run (evaluated from a "
                    "model without the run record), so its data order and schedule are unknown")
        infos.append((identify_eval(d), Path(d)))
    (a, wa), (b, wb) = infos
    check_pair(a, wa, b, wb, ignore=ARM_VARIES)
    return None


def cpt_table(inputs: Sequence[str | Path], published=None, n_resamples: int = 4999,
              source: Optional[str] = None) -> Table:
    """Continued pretraining: CPT gain, total gain, and MHAR gain (difference-in-differences) per task.
    ``source``: the published source quoted (default TABLES["cpt"].source)."""
    pub = load_published() if published is None else published
    source = check_source(pub, source or TABLES["cpt"].source)
    base_d, plain_d, mhar_d, scale, batch_check = _cpt_inputs(inputs)
    unchecked = check_arms(plain_d, mhar_d)  # data order / schedule differ: refused, with or without a manifest
    same = scale == "8B"
    checked = batch_check_passed(batch_check)
    tasks = sorted(set(eval_tasks(base_d)) & set(eval_tasks(plain_d)) & set(eval_tasks(mhar_d)))
    rows, results = [], []
    for task in tasks:
        tb, tp, tm = (load_eval_task(d, task) for d in (base_d, plain_d, mhar_d))
        metric = primary_metric(tm)
        with_mhar = set(align(tb, tm))
        ids = [k for k in align(tb, tp) if k in with_mhar]
        for t in (tb, tp, tm):
            t.docs = {k: t.docs[k] for k in ids}
        cpt = compare_task(tp, tb, metric, n_resamples=n_resamples)
        total = compare_task(tm, tb, metric, n_resamples=n_resamples)
        gain = compare_task(tm, tp, metric, n_resamples=n_resamples)
        mname = metric.split(",")[0]
        pb, pp, pm = (published_value(pub, source, "8B", m, mname, task=task) for m in ("base", "plain", "mhar"))
        pdelta = pm - pp if pm is not None and pp is not None else None
        row = {"task": task, "metric": metric, "n": gain.result.n, "base": cpt.value_b, "plain": cpt.value_a,
               "mhar": gain.value_a, "published_base": pb, "published_plain": pp, "published_mhar": pm,
               "published_delta": pdelta, "same_scale": same, "published_source": source, "mde80": gain.mde80,
               "comparison": f"MHAR - plain CPT: {task}", **paired_cols(gain.result), "test": gain.result.method,
               "single_seed": True,  # one run per arm: the verdict is about these two models
               "batch_check": {None: "absent", True: "identical", False: "FAILED"}[checked]}
        for name, c in (("cpt_gain", cpt), ("total_gain", total)):
            row.update({name: c.result.estimate, f"{name}_ci_low": c.result.ci_low,
                        f"{name}_ci_high": c.result.ci_high, f"{name}_p": c.result.p_value})
        if gain.mcnemar:
            row.update(discordant_mhar_better=gain.mcnemar.b, discordant_plain_better=gain.mcnemar.c)
        if checked is False:
            row["verdict"] = f"{vd.NOT_JUDGED}: CPT batch check failed"
        rows.append(row)
        results.append(gain.result)
    judge(rows, results, [checked is not False] * len(rows))
    cols = [Column("task / metric", lambda r: f"{r['task']} {r['metric']}"), Column("n", lambda r: str(r["n"])),
            Column("base / plain / MHAR", lambda r: f"{f_num(r['base'])} / {f_num(r['plain'])} / {f_num(r['mhar'])}"),
            Column("CPT gain (plain-base)", lambda r: f_ci(r["cpt_gain"], r["cpt_gain_ci_low"], r["cpt_gain_ci_high"])
                   + f", p {f_p(r['cpt_gain_p'])}"),
            Column("total (MHAR-base)", lambda r: f_ci(r["total_gain"], r["total_gain_ci_low"], r["total_gain_ci_high"])
                   + f", p {f_p(r['total_gain_p'])}"),
            Column("MHAR gain (MHAR-plain)", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS),
            Column("discordant", lambda r: f"{r['discordant_mhar_better']} vs {r['discordant_plain_better']}"
                   if is_number(r.get("discordant_mhar_better")) else "-"),
            Column("paper base / plain / MHAR", lambda r: f"{f_num(r['published_base'])} / "
                   f"{f_num(r['published_plain'])} / {f_num(r['published_mhar'])}"),
            Column("paper MHAR gain", lambda r: f_ci(r["published_delta"], None, None)),
            *(c() for c in JUDGE_COLS)]
    notes = ["The MHAR contribution is only MHAR - plain CPT (the difference-in-differences: total gain minus the "
             "CPT gain); the gain over base is mostly the continued pretraining itself and is never credited to MHAR.",
             "All three arms are paired on the same questions (one model per arm, so the question is the unit); 0/1 "
             "scores: exact McNemar p with a bootstrap CI (discordant = MHAR right & plain wrong vs the reverse). "
             "One run per arm shows whether these two models differ, not that the method does: verdicts are "
             f"'{vd.MODELS_DIFFER}' / '{vd.NO_DIFFERENCE}' (analysis/verdict.py VERDICT_RULE). "
             "Holm runs over the MHAR-gain rows only; the CPT and total gains are context, not verdicts.",
             f"Paper: Table 3 (Marin-8B, ~10B tokens). Scale of this run: {scale or 'unspecified'}; "
             + ("same as the paper." if same else "differs from the paper's 8B, so only signs are judged."),
             RULE_POINTER, *source_notes(source, [])]
    if checked is False:
        notes.append("The two CPT arms did NOT see identical batches (batch check failed): no verdict is given.")
    if unchecked:
        notes.append(unchecked[0].upper() + unchecked[1:] + ".")
    if batch_check is not None:
        notes.append("Batch identity of the two CPT arms (manifest batch_check): "
                     + json.dumps(batch_check, sort_keys=True, default=str)[:300])
    return Table("cpt", "Continued pretraining: CPT gain vs MHAR gain", rows, cols, notes,
                 provenance([str(p) for p in inputs]))


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table cpt (analysis.tables.registry)."""
    return cpt_table(inputs, n_resamples=b.n_resamples, source=b.source("cpt"))
