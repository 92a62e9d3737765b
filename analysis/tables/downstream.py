"""Downstream zero-shot table: each variant vs the baseline of the same size on the same seeds, per task."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import lm_metrics
from .. import stats as st
from .. import verdict as vd
from ..load.common import AnalysisInputError
from mhar.runs.sidecar import provenance
from ..load.published import (check_source, load_published, paper_scale, published_tasks, published_value,
                              source_notes)
from ..load.runs import identify_eval
from .rows import check_row, knobs_text, shown_knobs, variant_label
from ..load.samples import align, eval_tasks, load_eval_task
from .pairs import check_pair, is_baseline_of, judge, no_baseline, ordered, reference_group, seeds_text
from .questions import compare_task, primary_metric
from .render import Column, JUDGE_COLS, P_COLS, RULE_POINTER, Table, f_ci, f_num, paired_cols, with_scale
from .registry import TABLES, Build


def _eval_groups(eval_dirs: Sequence[str | Path]) -> dict[tuple, dict[int, tuple[Path, dict]]]:
    """{(variant, size, heads, knobs): {seed: (eval dir, identity)}} from the records of each eval dir; the runs
    of one group (a row) differ only by seed."""
    out: dict[tuple, dict[int, tuple[Path, dict]]] = {}
    for d in eval_dirs:
        d = Path(d)
        info = identify_eval(d)
        g = out.setdefault((info["variant"], info["size"], info["heads"], info["knobs"]), {})
        if info["seed"] in g:
            raise AnalysisInputError(f"{d} and {g[info['seed']][0]}: two evaluations of {info['label']} "
                                        f"{info['size']} seed {info['seed']}; pass each run's eval dir once")
        g[info["seed"]] = (d, info)
    for g in out.values():
        check_row([(info, d) for _, (d, info) in sorted(g.items())])
    return out


def _pair_evals(var: dict[int, tuple[Path, dict]], ref: dict[int, tuple[Path, dict]]) -> list[int]:
    (vd0, vi0), (rd0, ri0) = next(iter(var.values())), next(iter(ref.values()))
    if set(var) != set(ref):
        raise AnalysisInputError(
            f"cannot pair {vi0['label']} {vi0['size']} (seeds {sorted(var)}, e.g. {vd0}) with {ri0['label']} "
            f"{ri0['size']} (seeds {sorted(ref)}, e.g. {rd0}): seed sets differ; evaluate the same seeds for both")
    for s in sorted(var):
        (dv, iv), (dr, ir) = var[s], ref[s]
        check_pair(iv, dv, ir, dr)
    return sorted(var)


def downstream_table(eval_dirs: Sequence[str | Path], published=None, n_resamples: int = 4999,
                     source: Optional[str] = None) -> Table:
    """Zero-shot downstream metrics: each variant vs the baseline of the same size on the same seeds, per task.

    One seed: questions (or documents) are the unit, and the verdict can only say whether these two models
    differ (analysis.verdict VERDICT_RULE); several seeds: the seed is the unit. ``source``: the published source
    quoted (default TABLES["downstream"].source)."""
    pub = load_published() if published is None else published
    source = check_source(pub, source or TABLES["downstream"].source)
    groups = _eval_groups(eval_dirs)
    rows, results, unpaired = [], [], []
    in_paper = published_tasks(pub, source)
    shown = shown_knobs(groups)
    for key in ordered(groups, ident=lambda m: m[1]):
        variant, size, heads, _ = key
        knobs = shown[key]
        if variant == "baseline":
            continue
        var = groups[key]
        rkey = reference_group(groups, key, is_baseline_of(size), ident=lambda m: m[1])
        if rkey is None:
            unpaired.append(no_baseline(groups, key, ident=lambda m: m[1]))
            continue
        ref = groups[rkey]
        seeds = _pair_evals(var, ref)
        label = variant_label(next(iter(var.values()))[1]["display"], heads, knobs)
        scale, same = paper_scale(size)
        tasks = set.intersection(*(set(eval_tasks(d)) for s in seeds for d in (var[s][0], ref[s][0])))
        for task in sorted(tasks):
            per_seed = []
            for s in seeds:
                ta, tb = load_eval_task(var[s][0], task), load_eval_task(ref[s][0], task)
                metric = lm_metrics.for_tokenizer(primary_metric(ta), ta.metric_names(), var[s][1])
                per_seed.append(compare_task(ta, tb, metric, n_resamples=n_resamples))
            c0 = per_seed[0]
            if len(seeds) == 1:
                res, mde = c0.result, c0.mde80
            else:
                va, vb = [c.value_a for c in per_seed], [c.value_b for c in per_seed]
                res = vd.seed_level_evidence(va, vb)
                sd = float(np.std(np.subtract(va, vb), ddof=1))
                mde = st.mde_paired(len(seeds), sd)
            mname = lm_metrics.published_metric(metric)
            pv = published_value(pub, source, scale, "mhar", mname, task=task) if variant == "mhar" else None
            pb = published_value(pub, source, scale, "baseline", mname, task=task)
            pdelta = pv - pb if pv is not None and pb is not None else None
            one = len(seeds) == 1
            rows.append({"size": size, "seeds": seeds_text(seeds), "n_seeds": len(seeds), "single_seed": one,
                         "variant": variant, "heads": heads, "method": label, "residual": knobs_text(knobs),
                         "task": task, "metric": metric,
                         "n": c0.result.n if one else len(seeds), "n_questions": len(align(ta, tb)),
                         "ours_variant": float(np.mean([c.value_a for c in per_seed])),
                         "ours_baseline": float(np.mean([c.value_b for c in per_seed])),
                         "published_variant": pv, "published_baseline": pb, "published_delta": pdelta,
                         "published_metric": mname,
                         "same_scale": same, "published_scale": scale, "published_source": source, "mde80": mde, "test": res.method,
                         "unit": "seeds" if not one else "documents" if c0.kind == "perplexity" else "questions",
                         "discordant_variant_better": c0.mcnemar.b if (one and c0.mcnemar) else None,
                         "discordant_baseline_better": c0.mcnemar.c if (one and c0.mcnemar) else None,
                         "mcnemar_p": c0.mcnemar.p_value if (one and c0.mcnemar) else None,
                         "cluster_se": c0.cluster.se if (one and c0.cluster) else None,
                         "comparison": f"{label} - baseline: {task} ({size}, seeds {seeds_text(seeds)})",
                         **paired_cols(res)})
            results.append(res)
    judge(rows, results)
    # a paper column of a task the paper has no number for (e.g. the user's own) is empty, noted once below
    paper_text = lambda r, text: text if r["task"] in in_paper else ""  # noqa: E731
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]), Column("task / metric", lambda r: f"{r['task']} {r['metric']}"),
            Column("n", lambda r: f"{r['n']} {r['unit']}"),
            Column("baseline", lambda r: f_num(r["ours_baseline"])),
            Column("variant", lambda r: f_num(r["ours_variant"])),
            Column("Δ [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("test", lambda r: r["test"]), *(c() for c in P_COLS),
            Column("MDE (80%)", lambda r: f_num(r["mde80"])),
            Column("paper base / MHAR", lambda r: paper_text(r, with_scale(
                f"{f_num(r['published_baseline'])} / {f_num(r['published_variant'])}"
                + lm_metrics.unit_note(r["metric"], r["published_metric"]), r))),
            Column("paper Δ", lambda r: paper_text(r, with_scale(f_ci(r["published_delta"], None, None)
                                                   + lm_metrics.unit_note(r["metric"], r["published_metric"]), r))),
            *(c() for c in JUDGE_COLS)]
    notes = [lm_metrics.NOTE,
             "Paired by document (same doc_id and prompt) and by seed. One seed: 0/1 scores use the exact McNemar p "
             "with a percentile-bootstrap CI, or the cluster-robust t (CR1, clusters - 1 df) when questions share a "
             "context (HellaSwag); perplexity uses the document bootstrap with per-document swap p. Several seeds: "
             "paired t over seeds of the per-seed metric. The column 'test' names the test whose p is printed. "
             "Accuracies are fractions (the paper's percentages / 100).",
             "One training seed per arm: the question-level test shows only whether these two trained models "
             f"differ ('{vd.MODELS_DIFFER}' / '{vd.NO_DIFFERENCE}'), never that the method reproduces; "
             "that takes 2 or more seeds per arm (the seed is then the unit).",
             "Paper: Table 2 (zero-shot, 200 examples); its MHAR rows are compared with our MHAR runs of any H.",
             vd.SCALE_NOTE, RULE_POINTER, *source_notes(source, [])]
    own = sorted({r["task"] for r in rows} - in_paper)
    if own:
        notes.append(f"The paper has no number for {', '.join(own)} (paper columns left empty).")
    return Table("downstream", "Downstream zero-shot evaluation (paired vs baseline)", rows, cols, notes,
                 provenance([str(d) for d in eval_dirs]), unpaired)


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table downstream (analysis.tables.registry)."""
    return downstream_table(inputs, n_resamples=b.n_resamples, source=b.source("downstream"))
