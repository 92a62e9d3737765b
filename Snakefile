# MHAR reproduction workflow: train every variant x size x seed, evaluate, run the
# statistics and regenerate every table and figure.
#
#   snakemake --cores all reproduce_table1                         # CPU default
#   snakemake --cores all reproduce_table1 --configfile my_seeds.yaml   # an overlay on the defaults
#   snakemake --configfile config/paper.yaml --profile profiles/slurm all
#   snakemake --report report.html                                  # tables, figures and REPORT.md in one file
#
# Config (docs/WORKFLOW.md "Configs and overlays"): the defaults (config/config.yaml + config/cpt.yaml) load
# first and every --configfile / --config applies on top (mappings merge, lists and scalars replace), as
# Snakemake does; a complete config (one naming every required key of config/schema.yaml, e.g.
# config/paper.yaml, config/ci.yaml) stands on its own instead, and so does --replace-workflow-config.
# --config values are YAML: --config seeds=[0,1] 'stats={resamples: 999}'.
#
# Software: every rule names its conda environment (workflow/envs/{train,eval,analysis}.yaml),
# used with `--sdm conda`; without it, rules run in the current Python environment
# (`pip install -e ".[dev]"`), which is how GPU sites keep their own CUDA build of torch.
# Each result records its package versions and hardware (provenance.json).

from snakemake.utils import min_version

min_version("8.0")


# Config loading (defaults + overlays, --config as YAML, schema validation, the reports folder):
include: "workflow/rules/config.smk"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


rule all:
    input:
        f"{REPORTS}/REPORT.md",


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/released.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/cost.smk"
include: "workflow/rules/export.smk"


# The continued-pretraining arm lives in its own rule file (and config block).
if HAS_CPT:

    include: "workflow/rules/cpt_common.smk"
    include: "workflow/rules/cpt.smk"


include: "workflow/rules/report.smk"
include: "workflow/rules/slurm.smk"  # SLURM executor: refuse a status command that cannot see jobs


# Cheap jobs run where Snakemake runs (never submitted to a cluster).
localrules:
    all,
    table,
    figure,
    report,
    reproduce_table1,
    reproduce_seeds,
    reproduce_heads,
    reproduce_downstream,
    reproduce_cost,
    reproduce_cpt,
    reproduce_released,


rule reproduce_table1:
    default_target: config.get("target") == "reproduce_table1"
    input:
        table_files("table1"),
        figure_files("loss_curves"),


rule reproduce_seeds:
    default_target: config.get("target") == "reproduce_seeds"
    input:
        table_files("seeds"),


rule reproduce_heads:
    default_target: config.get("target") == "reproduce_heads"
    input:
        table_files("heads"),
        figure_files("head_sweep"),


rule reproduce_downstream:
    default_target: config.get("target") == "reproduce_downstream"
    input:
        table_files("downstream"),


rule reproduce_cost:
    default_target: config.get("target") == "reproduce_cost"
    input:
        reproduce_cost_inputs,


rule reproduce_cpt:
    default_target: config.get("target") == "reproduce_cpt"
    input:
        reproduce_cpt_inputs,


# The authors' released checkpoints (config `released:`, e.g. --configfile config/released.yaml): import,
# evaluate, and the released-models table beside their published numbers.
rule reproduce_released:
    default_target: config.get("target") == "reproduce_released"
    input:
        reproduce_released_inputs,
