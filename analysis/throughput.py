"""Throughput statistics of training-throughput records (``benchmarks/bench_training.py`` CSVs): is a target met,
is one routing faster than another? The statistics are ``verdicts`` (one-sided t test of the mean ratio against a
target per size, Holm over the sizes) and ``compare`` (paired t test of two variants measured in the same runs), on
the one t interval and Holm of ``analysis.stats`` / ``analysis.verdict`` and its words (``verdict.target_verdict``);
``load_units`` / ``load_pairs`` read a record; ``main`` is the CLI.

    python -m analysis.throughput results/bench/training.csv                              # mhar_fused vs 0.90
    python -m analysis.throughput results/bench/training.csv --target 0.95 --unit call
    python -m analysis.throughput F.csv --variant mhar_eager --json
    python -m analysis.throughput results/bench/training.csv --mode both --unit call     # + the trainer rows

Each row of the record with ``mode`` "step" (``--mode``: "trainer" for the ``python -m mhar.train`` rows, "both"),
the variant, status ok and a ``thr_ratio`` (MHAR's tokens/s over the baseline's, both measured in ONE run: a
truly paired ratio) is one run. Records written before the routing names were unified name variants as they
were then (``analysis.load.bench.bench_variant``: their ``mhar_fused_v7_sg8_pdl`` rows are ``mhar_fused``, their
``mhar_fused`` rows ``mhar_fused_v6``). ``--unit run`` (default) treats every run as independent; ``--unit call``
first averages the runs that share a device call (the ``source`` column's "session ... call N": same machine, same
compile caches), the stricter unit when a call holds repeats. Per size: n, mean, sample sd, the 95% t interval
(``analysis.stats.t_interval``), the one-sided t test of mean > target (scipy) and its Holm adjustment over the sizes
(``analysis.verdict.holm``: the target is asked at EVERY size, so each size is one of several tests). Verdict per
size: "met" (Holm p < alpha), "below" (the interval's upper end under the target), else "not demonstrated" (with one
unit, always), "not measured" for a size of ``--sizes`` without runs. The target holds overall only if every size
is "met".

``--against B`` compares two variants measured in the SAME runs instead (each against the baseline of its own run:
a call's k-th baseline row opens its k-th run): per size, the paired differences of the ratios (variant - B), their
95% t interval and the one-sided paired t test of variant > B (scipy ``ttest_rel``), Holm over the sizes; and all
sizes pooled (one test over every pair). Runs that hold only one of the two are left out.

    python -m analysis.throughput results/bench/training.csv --variant mhar_fused --against mhar_fused_nopdl
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from mhar.model.presets import PRESETS, size_key

from . import verdict as vd
from .load.bench import bench_variant
from .stats import sample_t_interval

# the sizes a throughput target is asked for by default: the paper's (the presets with a paper scale)
PAPER_SIZES = tuple(n for n in sorted(PRESETS, key=size_key) if PRESETS[n].paper_scale)


def _variant(row: dict) -> str:
    """The row's variant under the current names (``bench_variant``)."""
    return bench_variant(row["variant"], row.get("routing_resolved"))


def _call_id(source: str) -> str:
    """The device call a row came from ("session <record> call <n>" in the source column), or the whole source string."""
    m = re.search(r"session \S+ call \d+", source or "")
    return m.group(0) if m else (source or "")


MODES = {"step": ("step",), "trainer": ("trainer",), "both": ("step", "trainer")}


def _read_record(path: str | Path) -> list[dict]:
    """The record's rows (dicts); errors name the file: missing, not CSV, not a training-throughput record."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such training-throughput record")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read it as CSV ({e})") from e
    if rows and not {"size", "variant", "mode", "thr_ratio", "status"} <= set(rows[0]):
        raise ValueError(f"{path}: not a training-throughput record (needs size, variant, mode, thr_ratio, status)")
    return rows


def _ratio(path: Path, i: int, row: dict) -> float:
    """Row i's thr_ratio as a finite float; else an error naming the file and its line."""
    x = float(row["thr_ratio"])
    if not math.isfinite(x):
        raise ValueError(f"{path}: row {i + 2} has thr_ratio {row['thr_ratio']!r}")
    return x


def load_units(path: str | Path, variant: str, unit: str = "run",
               mode: str = "step") -> dict[str, list[tuple[str, float]]]:
    """size -> [(unit label, ratio)]: the record's paired ratios of ``variant`` (status ok) in ``mode`` ("step":
    the benchmark's TrainStep rows; "trainer": the ``python -m mhar.train`` rows of ``--trainer-steps``, each paired
    with the trainer baseline of its call; "both"), one per run or, with ``unit="call"``, the mean of each call's
    runs (a call's step and trainer rows re-measure one build: with "both", use calls as units)."""
    if unit not in ("run", "call"):
        raise ValueError(f"unit {unit!r}: use 'run' or 'call'")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    path, rows = Path(path), _read_record(path)
    runs: dict[str, list[tuple[str, float]]] = {}
    for i, r in enumerate(rows):
        if _variant(r) != variant or r["mode"] not in MODES[mode] or r["status"] != "ok" or not r["thr_ratio"]:
            continue
        x = _ratio(path, i, r)
        runs.setdefault(r["size"], []).append((_call_id(r.get("source", "")) or f"row {i + 2}", x))
    if unit == "run":
        return runs
    out = {}
    for size, xs in runs.items():
        calls: dict[str, list[float]] = {}
        for label, x in xs:
            calls.setdefault(label, []).append(x)
        out[size] = [(label, sum(v) / len(v)) for label, v in calls.items()]
    return out


def verdicts(units: dict[str, list[tuple[str, float]]], target: float, alpha: float = 0.05,
             sizes: tuple = ()) -> list[dict]:
    """One row per size (in preset order, ``size_key``): n, ratios, mean, sd, ci95, p (one-sided, mean > target),
    p_holm (over the sizes with n >= 2), verdict. ``sizes``: sizes that must appear ("not measured", n 0, when the
    record has no run of them)."""
    from scipy import stats  # lazy: scipy (a slow import), only when a target is judged

    out = []
    for size in sorted(set(units) | set(sizes), key=size_key):
        if not units.get(size):
            out.append({"size": size, "n": 0, "ratios": [], "mean": None, "sd": None, "ci95": None, "p": None,
                        "p_holm": None, "verdict": vd.NOT_MEASURED})
            continue
        x = np.array([v for _, v in units[size]], float)
        row = {"size": size, "n": int(x.size), "ratios": [round(float(v), 4) for v in x],
               "mean": float(x.mean()), "sd": None, "ci95": None, "p": None, "p_holm": None}
        if x.size >= 2:
            _, row["sd"], lo, hi = sample_t_interval(x, 1 - alpha)
            row["ci95"] = [lo, hi]
            row["p"] = float(stats.ttest_1samp(x, target, alternative="greater").pvalue)
        out.append(row)
    _holm(out)
    for r in out:
        if r["n"]:
            r["verdict"] = vd.target_verdict(r["p_holm"], r["ci95"], target, alpha)
    return out


def _holm(rows: list[dict]) -> None:
    """p_holm of the rows that carry a p (analysis.verdict.holm over them)."""
    tested = [r for r in rows if r["p"] is not None]
    for r, pa in zip(tested, vd.holm([r["p"] for r in tested])):
        r["p_holm"] = float(pa)


def load_pairs(path: str | Path, variant: str, against: str,
               mode: str = "step") -> dict[str, list[tuple[str, float, float]]]:
    """size -> [(run label, ratio of ``variant``, ratio of ``against``)] for the runs that measured both: a run is
    a call's k-th baseline row of that size and mode and the rows after it (``bench_training`` writes each
    repeat as the baseline, then the variants in order); its label "<call> run k"."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    path, rows = Path(path), _read_record(path)
    opened: dict[tuple, int] = {}
    seen: dict[tuple, dict[str, float]] = {}
    for i, r in enumerate(rows):
        if r["mode"] not in MODES[mode]:
            continue
        call = _call_id(r.get("source", "")) or f"row {i + 2}"
        key = (r["size"], call, r["mode"])
        if r["variant"] == "baseline":
            opened[key] = opened.get(key, 0) + 1
            continue
        if _variant(r) not in (variant, against) or r["status"] != "ok" or not r["thr_ratio"]:
            continue
        x = _ratio(path, i, r)
        run = (r["size"], f"{call} run {opened.get(key, 0)}" + ("" if mode == "step" else f" ({r['mode']})"))
        seen.setdefault(run, {})[_variant(r)] = x
    out: dict[str, list[tuple[str, float, float]]] = {}
    for (size, label), v in seen.items():
        if variant in v and against in v:
            out.setdefault(size, []).append((label, v[variant], v[against]))
    return out


def compare(pairs: dict[str, list[tuple[str, float, float]]], alpha: float = 0.05) -> list[dict]:
    """Per size, then "all" (every pair pooled): n pairs, mean difference (variant - against), sd, its 95% t
    interval, the one-sided paired t test of variant > against (scipy ``ttest_rel``), Holm over the sizes (not
    the pooled row), verdict "faster" (Holm p < alpha; pooled: p < alpha), "slower" (interval under 0), else
    "not demonstrated"."""
    from scipy import stats  # lazy: scipy (a slow import), only when a target is judged

    def row(size, items):
        a = np.array([x for _, x, _ in items], float)
        b = np.array([y for _, _, y in items], float)
        r = {"size": size, "n": int(a.size), "diffs": [round(float(v), 4) for v in a - b],
             "mean": float((a - b).mean()), "sd": None, "ci95": None, "p": None, "p_holm": None}
        if a.size >= 2:
            _, r["sd"], lo, hi = sample_t_interval(a - b, 1 - alpha)
            r["ci95"] = [lo, hi]
            r["p"] = float(stats.ttest_rel(a, b, alternative="greater").pvalue)
        return r

    out = [row(s, pairs[s]) for s in sorted(pairs, key=size_key)]
    _holm(out)
    if len(out) > 1:
        pooled = row("all", [it for s in pairs for it in pairs[s]])
        pooled["p_holm"] = pooled["p"]
        out.append(pooled)
    for r in out:
        r["verdict"] = vd.target_verdict(r["p_holm"], r["ci95"], 0.0, alpha, met=vd.FASTER, below=vd.SLOWER)
    return out


def compare_markdown(rows: list[dict], variant: str, against: str, mode: str = "step") -> str:
    lines = [f"`{variant}` - `{against}`: paired differences of the throughput ratio, same runs (rows: {mode}; "
             "one-sided paired t test, Holm over sizes; 'all': every pair pooled, not adjusted)",
             "", "| size | pairs | differences | mean | sd | 95% interval | p | p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = "-" if r["ci95"] is None else f"{r['ci95'][0]:+.4f} to {r['ci95'][1]:+.4f}"
        lines.append(f"| {r['size']} | {r['n']} | {', '.join(f'{v:+.4f}' for v in r['diffs'])} | {r['mean']:+.4f} | "
                     f"{_fmt(r['sd'])} | {ci} | {_fmt(r['p'], 3)} | {_fmt(r['p_holm'], 3)} | {r['verdict']} |")
    return "\n".join(lines)


def _fmt(v, nd=4):
    return "-" if v is None else f"{v:.{nd}f}"


def markdown(rows: list[dict], target: float, variant: str, unit: str, mode: str = "step") -> str:
    lines = [f"`{variant}` throughput ratio vs target {target:g} (rows: {mode}; unit: {unit}; one-sided t test, "
             f"Holm over sizes)",
             "", "| size | n | ratios | mean | sd | 95% interval | p | p (Holm) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = "-" if r["ci95"] is None else f"{r['ci95'][0]:.4f}-{r['ci95'][1]:.4f}"
        lines.append(f"| {r['size']} | {r['n']} | {', '.join(f'{v:.4f}' for v in r['ratios']) or '-'} | {_fmt(r['mean'])} | "
                     f"{_fmt(r['sd'])} | {ci} | {_fmt(r['p'], 3)} | {_fmt(r['p_holm'], 3)} | {r['verdict']} |")
    overall = ("met at every size" if rows and all(r["verdict"] == vd.TARGET_MET for r in rows)
               else "not met at every size")
    lines += ["", f"Overall: {overall}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("record", help="training-throughput CSV (benchmarks/bench_training.py --out)")
    ap.add_argument("--variant", default="mhar_fused")
    ap.add_argument("--target", type=float, default=0.90)
    ap.add_argument("--unit", choices=("run", "call"), default="run")
    ap.add_argument("--mode", choices=tuple(MODES), default="step",
                    help="rows to use: the benchmark's step rows (default), the trainer rows, or both (then prefer "
                         "--unit call: a call's step and trainer rows measure the same build)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--sizes", nargs="+", default=list(PAPER_SIZES),
                    help="sizes the target is asked for (a size without runs is 'not measured'; default: %(default)s)")
    ap.add_argument("--against", metavar="VARIANT",
                    help="compare --variant with this variant over the runs that measured both (paired)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of a table")
    args = ap.parse_args(argv)
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha {args.alpha}: must be in (0, 1)")
    if args.against:
        load = lambda: load_pairs(args.record, args.variant, args.against, args.mode)  # noqa: E731
        empty = (f"no run holds both {args.variant!r} and {args.against!r} (ok {args.mode} rows with a thr_ratio); "
                 "check --variant / --against / --mode")
        analyse = lambda data: compare(data, args.alpha)  # noqa: E731
        tag = {"variant": args.variant, "against": args.against, "mode": args.mode}
        table = lambda rows: compare_markdown(rows, args.variant, args.against, args.mode)  # noqa: E731
    else:
        load = lambda: load_units(args.record, args.variant, args.unit, args.mode)  # noqa: E731
        empty = f"no ok {args.mode} rows with a thr_ratio for variant {args.variant!r}; check --variant / --mode"
        analyse = lambda data: verdicts(data, args.target, args.alpha, tuple(args.sizes))  # noqa: E731
        tag = {"variant": args.variant, "target": args.target, "unit": args.unit, "mode": args.mode}
        table = lambda rows: markdown(rows, args.target, args.variant, args.unit, args.mode)  # noqa: E731
    try:
        data = load()
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not data:
        print(f"error: {args.record}: {empty}", file=sys.stderr)
        return 2
    rows = analyse(data)
    if args.json:
        for r in rows:
            print(json.dumps({**r, **tag}))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
