# Shared helpers: paths, run configs and their identity, target lists.
# Every function here is pure config -> strings; the rules stay declarative.

import copy
import functools
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

# The repository root holds the `mhar` and `eval` packages: run identities and paths are
# computed by the library itself (jobs import them via workflow/scripts/_glue.py).
REPO = Path(workflow.basedir).resolve()
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mhar.model.config import ConfigError, config_hash  # noqa: E402
from mhar.runs.config import run_config_from_dict  # noqa: E402
from mhar.runs.layout import EVAL_LAYOUT, RUN_LAYOUT, data_key, run_key  # noqa: E402

# stdlib only: every table's record
from analysis.tables.registry import TABLES  # noqa: E402

RESULTS = config["results_dir"].rstrip("/")
REPORTS = config["reports_dir"].rstrip("/")
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"  # each job's `benchmark:` record (wall time, memory, I/O), per rule
RES = config["resources"]
if config.get("data_dir") and not Path(config["data_dir"]).expanduser().is_dir():
    raise WorkflowError(
        f"data_dir {config['data_dir']!r} is not a directory: point it at a local data mirror "
        "(layout of shared/data), or set it to null to use $MHAR_DATA_DIR / the Hugging Face hub"
    )

T1_LABELS = config["table1"]["variants"]
BASELINE = config["table1"]["baseline"]
for _block in ("table1", "heads", "downstream"):
    _undefined = [v for v in config[_block]["variants"] if v not in config["variants"]]
    if _undefined:
        raise WorkflowError(
            f"{_block}.variants names undefined label(s) {', '.join(map(repr, _undefined))}; "
            f"define them under `variants:` (defined: {', '.join(config['variants'])})"
        )
if BASELINE not in config["variants"] or BASELINE not in T1_LABELS:
    raise WorkflowError(
        f"table1.baseline {BASELINE!r} must be one of table1.variants "
        f"({', '.join(T1_LABELS)}) and defined under `variants:`"
    )
if BASELINE not in config["downstream"]["variants"]:
    raise WorkflowError(
        f"table1.baseline {BASELINE!r} is the reference of the paired downstream statistics: "
        f"add it to downstream.variants ({', '.join(config['downstream']['variants'])})"
    )

# One run directory per (variant label, size, seed, run identity): mhar.runs.layout.RUN_LAYOUT, see
# docs/ARCHITECTURE.md "Run directory". The identity ({rid}, mhar.runs.config.identity_hash) covers
# everything that can change a result (the label's residual config, data seed, ...), so a redefined
# label trains into a new directory and never reruns (Snakemake would delete the outputs first) a
# finished run; execution choices (routing_impl, compile, device, threads, cadence) are not in it.
RUN = f"{RESULTS}/{RUN_LAYOUT}"
# One evaluation directory per run, evaluation-settings hash and task (mhar.runs.layout.EVAL_LAYOUT).
EVAL = f"{RESULTS}/{EVAL_LAYOUT}"


def _deep_merge(base, over):
    """`base` updated recursively by `over` (new dict; lists and scalars are replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def residual_of(label):
    """Residual config of a variant label (e.g. mhar_h8 -> {variant: mhar, heads: 8})."""
    if label not in config["variants"]:
        raise WorkflowError(
            f"variant label {label!r} is used but not defined under `variants:` in the config; "
            f"defined labels: {', '.join(config['variants'])}"
        )
    return dict(config["variants"][label])


# The config's results hash (config.smk study_hash). Experiment tracking (config `tracking`, bookkeeping): the
# runs of one config form one group named by it; each run is named <label>/<size>/seed<k>. The report-stage
# jobs (tables, figures, probe, REPORT.md) log to {LOGS}/reports/<hash>/ and {BENCHMARKS}/reports/<hash>/:
# their paths name no run, so an overlay (reports in <results_dir>/reports/<hash>) would otherwise overwrite
# the defaults' logs. Runs, evaluations and shards are logged by their own path (shared between configs).
TRACKING = [] if config.get("tracking") in (None, "none") else list(config["tracking"])
STUDY_HASH = study_hash()


def run_config(label, size, seed):
    """The resolved run-config dict of one run (what `python -m mhar.train` receives)."""
    over = config.get("size_overrides", {}).get(size, {})
    cfg = _deep_merge(config["train"], over)
    train = {"seed": int(seed)}
    if TRACKING:
        train.update(tracking=TRACKING, tracking_group=STUDY_HASH)
    return _deep_merge(
        cfg,
        {
            # meta.variant stays the residual variant (the analysis groups runs by
            # variant + heads); the label is the run's name and its path component.
            "meta": {"name": label, "size": size},
            "model": {"preset": size, "residual": residual_of(label)},
            "train": train,
        },
    )


def eval_wandb_args(wildcards, output):
    """eval.run --wandb-args of an evaluation job (config `eval_wandb_args`; None: off): group = the
    config's results hash, name = <label>/<size>/seed<k>/<task> unless the config sets them. A function
    of the output path, so Snakemake's params-changed check does not rerun finished evaluations.
    """
    given = config.get("eval_wandb_args")
    if not given:
        return None
    keys = {
        part.split("=", 1)[0].strip()
        for part in given.replace(" ", ",").split(",")
        if part
    }
    extra = []
    if "group" not in keys:
        extra.append(f"group={STUDY_HASH}")
    if "name" not in keys:
        who = (
            f"released/{wildcards.label}"
            if "label" in wildcards.keys()
            else f"{wildcards.variant}/{wildcards.size}/seed{wildcards.seed}"
        )
        extra.append(f"name={who}/{wildcards.task}")
    return ",".join([given, *extra])


# A run-config key path in an error message (train.lr, model.residual.heads; `valid keys of train:`).
_RUN_KEY = re.compile(
    r"(?<![\w.])(model\.residual|meta|model|data|train)((?:\.\w+)+|(?=:))"
)


def _workflow_key(key, label, size):
    """A run-config key path (model.residual.heads, train.lr) as the workflow config spells it: the residual
    from variants.<label>, the rest from size_overrides.<size> where that block sets it, else the train block.
    """
    if key == "model.residual" or key.startswith("model.residual."):
        return f"variants.{label}{key[len('model.residual'):]}"
    node = config.get("size_overrides", {}).get(size) or {}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return f"size_overrides.{size}.{key}" if node is not None else f"train.{key}"


@functools.lru_cache(maxsize=None)
def _resolved(label, size, seed):
    """The validated RunConfig of one run; a config error is one `error:` line naming the key as the workflow
    config spells it (train.train.lrr for `--config 'train={train: {lrr: 0.1}}'`), the label and the size.
    """
    try:
        return run_config_from_dict(run_config(label, size, seed))
    except ConfigError as err:
        msg = _RUN_KEY.sub(lambda m: _workflow_key(m.group(0), label, size), str(err))
        _config_error(
            f"invalid workflow config (run config of variant {label!r}, size {size!r}): {msg}"
        )


def rid_of(label, size, seed):
    """Run-identity path component: the first 10 hex digits of mhar.runs.config.identity_hash."""
    return run_key(_resolved(label, size, int(seed)))["rid"]


def data_key_of(label, size):
    """Key of the tokenization job of (label, size): mhar.runs.layout.data_key (data section + vocabulary)."""
    return data_key(_resolved(label, size, 0))


def run_dir(label, size, seed):
    return RUN.format(
        variant=label, size=size, seed=seed, rid=rid_of(label, size, seed)
    )


def checked_run_config(wildcards):
    """Run config for a train job; refuses a path whose identity is not the config's."""
    want = run_dir(wildcards.variant, wildcards.size, wildcards.seed)
    got = RUN.format(**dict(wildcards.items()))
    if got != want:
        raise WorkflowError(
            f"{got} does not match the current config ({want}); "
            "request targets through the rules (e.g. reproduce_table1)"
        )
    return run_config(wildcards.variant, wildcards.size, wildcards.seed)


def train_run_config(wildcards, output):
    """checked_run_config as a parameter derived from the output path: Snakemake leaves it
    out of its params-changed check, so knobs that cannot change a result (train.threads,
    log/checkpoint cadence) replan nothing; every knob that can is in the path ({rid}).
    """
    return checked_run_config(wildcards)


def all_sizes():
    """Every size some target trains (Table 1, head sweep, downstream)."""
    sizes = list(config["sizes"])
    for block in ("heads", "downstream"):
        sizes += [s for s in config[block]["sizes"] if s not in sizes]
    return sizes


def data_run_config(wildcards, output):
    """Run config whose data block the shards of data key `wildcards.dkey` are built from."""
    for size in all_sizes():
        for label in config["variants"]:
            if data_key_of(label, size) == wildcards.dkey:
                return run_config(label, size, 0)
    raise WorkflowError(f"no configured run has data key {wildcards.dkey}")


def train_shards(wildcards):
    """The tokenization record a train job waits for (ancient: its age never reruns a run)."""
    return ancient(
        f"{RESULTS}/data/{data_key_of(wildcards.variant, wildcards.size)}/shards.json"
    )


def grid(labels, sizes, seeds):
    return [(v, s, k) for s in sizes for v in labels for k in seeds]


def run_files(name, labels, sizes, seeds):
    """`name` (summary.json, model.pt, ...) of every run in the grid."""
    return [f"{run_dir(v, s, k)}/{name}" for v, s, k in grid(labels, sizes, seeds)]


# --- Table 1 / seed table ---------------------------------------------------------
def table1_summaries():
    return run_files("summary.json", T1_LABELS, config["sizes"], config["seeds"])


def table1_runs():
    return [
        run_dir(v, s, k)
        for v, s, k in grid(T1_LABELS, config["sizes"], config["seeds"])
    ]


# --- head sweep -------------------------------------------------------------------
def heads_summaries():
    h = config["heads"]
    return run_files("summary.json", h["variants"], h["sizes"], h["seeds"])


# --- downstream evaluation ------------------------------------------------------------
DS = config["downstream"]


def eval_settings():
    """What an evaluation's outputs depend on besides the model and the task (hashed into
    paths); batch size and device are execution details."""
    return {"subset": DS["subset"], "bootstrap_iters": DS["bootstrap_iters"]}


EHASH = config_hash(eval_settings(), 8)


def ds_grid():
    return grid(DS["variants"], DS["sizes"], DS["seeds"])


def eval_dir(label, size, seed, task):
    return EVAL.format(
        variant=label,
        size=size,
        seed=seed,
        rid=rid_of(label, size, seed),
        ehash=EHASH,
        task=task,
    )


# --- task names: lm-eval's registry (stock tasks + eval/tasks + tasks_dir), checked when the DAG is built
TASKS_DIR = config.get("tasks_dir") or None


def check_task_names(names, where):
    """Stop with one `error:` line when a task name is no safe path component (config/schema.yaml's rule:
    it names result folders) or lm-eval's registry does not know it (nothing runs)."""
    allowed = SCHEMA["$defs"]["tasks"]["items"]
    for name in names:
        if not (
            isinstance(name, str)
            and re.fullmatch(allowed["pattern"], name)
            and len(name) <= allowed["maxLength"]
        ):
            print(
                f"error: {where}: {brief(name)} is not allowed: {allowed['description']}",
                file=sys.stderr,
            )
            sys.exit(1)
    if TASKS_DIR and not Path(TASKS_DIR).expanduser().is_dir():
        print(
            f"error: tasks_dir {TASKS_DIR!r} is not a directory; point it at a folder of lm-eval task YAMLs",
            file=sys.stderr,
        )
        sys.exit(1)
    # (without lm-eval where Snakemake runs, the evaluation jobs check the names)
    try:
        from eval.data_local import (
            registered_names,
            unknown_task_message,
            unknown_tasks,
        )
    except ImportError as err:
        logger.warning(f"task names of {where} not checked here ({err})")
        return
    tasks_dir = TASKS_DIR and Path(TASKS_DIR).expanduser()
    try:
        unknown = unknown_tasks(names, tasks_dir)
    except ValueError as err:  # a task YAML refused (mhar.safe_yaml's bounds)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    if unknown:
        folders = ["eval/tasks"] + ([TASKS_DIR] if TASKS_DIR else [])
        msg = unknown_task_message(
            unknown[0], registered_names(tasks_dir), folders, where
        )
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(1)


check_task_names(DS["tasks"], "downstream.tasks")


def downstream_results():
    return [
        f"{eval_dir(v, s, k, t)}/results.json"
        for v, s, k in ds_grid()
        for t in DS["tasks"]
    ]


# --- cost ---------------------------------------------------------------------------
COST = config["cost"]
COST_HASH = config_hash(COST, 8)
# A fresh benchmark run (cost.run_benchmark) lands beside, not among, the committed records.
BENCH_CSV = f"{RESULTS}/bench/{COST_HASH}/training.csv"


def bench_csvs():
    """The listed benchmark records (cost.bench_files), plus the fresh one when the benchmark is configured."""
    return list(COST["bench_files"]) + ([BENCH_CSV] if COST["run_benchmark"] else [])


# --- resources ---------------------------------------------------------------------------
def gpu_resources(n):
    """Scheduler resources of a job on `n` GPUs (local: nvidia_gpu; SLURM plugin: gpu)."""
    res = {"gpu": n, "nvidia_gpu": n}
    if n and RES.get("gpu_model"):
        res["gpu_model"] = RES["gpu_model"]
    return res


# --- mechanism probe / routing heatmap -------------------------------------------------
def probed(label):
    """Whether a label's variant is one the probe reads (Residual.routes_full_depth in the residual
    registry, modules outside mhar.model.residuals included): a new routed variant is probed without a rule edit.
    """
    from mhar.model.residuals import residual_class

    res = residual_of(label)
    try:
        return residual_class(res["variant"], res.get("module")).routes_full_depth
    except ConfigError as err:
        raise WorkflowError(f"variant label {label!r}: {err}")


def probe_files():
    """One probe JSON per routed Table 1 label and size (first seed), read by the report."""
    return [
        f"{REPORTS}/probe/{s}/{v}.json"
        for s in config["sizes"]
        for v in T1_LABELS
        if probed(v)
    ]


def probe_model(wildcards):
    return f"{run_dir(wildcards.variant, wildcards.size, config['seeds'][0])}/model.pt"


# --- target lists ----------------------------------------------------------------------
def table_files(name):
    return [f"{REPORTS}/{name}.{ext}" for ext in ("md", "csv", "tex")]


def table_report(name):
    """A table's .md/.csv/.tex outputs, flagged for `snakemake --report` (category Tables)."""
    return report(
        multiext(f"{REPORTS}/{name}", ".md", ".csv", ".tex"),
        category="Tables",
        subcategory=name,
        caption="../report/table.rst",
        labels={"table": name},
    )


def figure_files(name):
    return [f"{REPORTS}/figures/{name}.{ext}" for ext in ("png", "pdf")]


def figure_sources():
    """Figure name -> its input files, for the figures this config can draw."""
    src = {
        "loss_curves": table1_summaries(),
        "loss_vs_compute": table1_summaries(),
        "head_sweep": heads_summaries(),
        # figures that draw a table's numbers read that table's CSV: same inputs, one code path
        "forest": [f"{REPORTS}/table1.csv", f"{REPORTS}/downstream.csv"],
    }
    if bench_csvs():
        src["cost"] = [f"{REPORTS}/cost.csv"]
    if probe_files():
        src["routing_heatmap"] = probe_files()
    return src


FIGURES = figure_sources()


def figure_inputs(wildcards):
    return FIGURES[wildcards.figure]


HAS_CPT = Path(workflow.basedir, "workflow/rules/cpt.smk").exists() and "cpt" in config


def reproduce_cpt_inputs(wildcards):
    """CPT table, or a clear error when this config has no CPT arm."""
    if not HAS_CPT:
        raise WorkflowError(
            "reproduce_cpt: this config has no `cpt:` block; add one, e.g. "
            "--configfile config/config.yaml config/cpt.yaml (GPU: config/paper.yaml config/cpt_paper.yaml)"
        )
    return cpt_targets()


def reproduce_cost_inputs(wildcards):
    """Cost table, or a clear error when there is nothing to tabulate."""
    if not bench_csvs():
        raise WorkflowError(
            "reproduce_cost: cost.bench_files is empty and cost.run_benchmark is false; list benchmark "
            "CSVs (e.g. results/bench/training.csv) in cost.bench_files or set cost.run_benchmark: true"
        )
    return table_files("cost")


# --- released checkpoints (config `released:`; their rules and RELEASED in released.smk) ---------------------
def check_released_arms(arms):
    """Stop with one `error:` line (nothing runs) when an arm's `hf:` is a local path that is not a model folder,
    or its `published:` choice names no row of analysis/published.csv (table released).
    """
    for label, arm in arms.items():
        hf = Path(str(arm["hf"])).expanduser()
        local = Path(str(arm["hf"])).is_absolute() or str(arm["hf"]).startswith(
            (".", "~")
        )
        if local and not (hf / "config.json").is_file():
            what = (
                "does not exist"
                if not hf.exists()
                else "has no config.json (not a Hugging Face model folder)"
            )
            print(
                f"error: released.{label}.hf: local path {arm['hf']!r} {what}; give a Hugging Face model "
                "folder or a hub name org/name",
                file=sys.stderr,
            )
            sys.exit(1)
    # (without the analysis packages where Snakemake runs, the table job checks the choices)
    try:
        from analysis.tables.released import check_choices
        from analysis.load.common import AnalysisInputError
    except ImportError as err:
        logger.warning(f"released.*.published not checked here ({err})")
        return
    try:
        check_choices(arms)
    except AnalysisInputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def reproduce_released_inputs(wildcards):
    """The released-models table, or a clear error when this config has no released arms."""
    if not RELEASED:
        raise WorkflowError(
            "reproduce_released: this config has no `released:` arms; add them, e.g. "
            "--configfile config/released.yaml (the authors' released checkpoints)"
        )
    return table_files("released")


def report_inputs():
    """Everything REPORT.md summarises, and all it reads (analysis.report reads these files only, so another
    config's reports in a subfolder never enter): every table of the registry this config has inputs for (an
    optional one, e.g. released, only through its own target), the figures, the probe JSONs, the CPT arm's outputs.
    """
    files = []
    for name, spec in TABLES.items():
        if spec.optional or spec.inputs == "cpt":
            continue
        if TABLE_INPUTS[spec.inputs]():  # workflow/rules/tables.smk
            files += table_files(name)
    for name in FIGURES:
        files += figure_files(name)
    files += probe_files()
    if HAS_CPT:
        files += cpt_targets()
    return files


# --- wildcard constraints (labels and presets never contain '/') ---------------------
wildcard_constraints:
    dkey="[0-9a-f]+",
    rid="[0-9a-f]+",
    ehash="[0-9a-f]+",
    seed="[0-9]+",
    variant="[A-Za-z0-9][A-Za-z0-9_.-]*",
    baseline="[A-Za-z0-9][A-Za-z0-9_.-]*",
    size="[A-Za-z0-9][A-Za-z0-9_.-]*",
    task="[A-Za-z0-9_.-]+",
    figure="|".join(FIGURES),
