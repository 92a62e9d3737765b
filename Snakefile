# MHAR reproduction workflow: train every variant x size x seed, evaluate, run the
# statistics and regenerate every table and figure.
#
#   snakemake --cores all reproduce_table1                         # CPU default
#   snakemake --configfile config/paper.yaml --profile profiles/slurm all
#
# A --configfile replaces config/config.yaml (it is not merged into it); see docs/WORKFLOW.md.
#
# Software: every rule names its conda environment (workflow/envs/{train,eval,analysis}.yaml),
# used with `--sdm conda`; without it, rules run in the current Python environment
# (`pip install -e ".[dev]"`), which is how GPU sites keep their own CUDA build of torch.
# Each result records its package versions and hardware (provenance.json).

from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("8.0")


# The default config applies only when no --configfile is given: a config replaces it.
# Default (no --configfile given): the CPU config plus the CPU continued-pretraining arm.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"
    configfile: f"{workflow.basedir}/config/cpt.yaml"


# On a schema error snakemake prints the whole schema: name the field and the problem instead.
try:
    validate(config, "config/schema.yaml")
except WorkflowError:
    import jsonschema
    import yaml

    with open(Path(workflow.basedir) / "config/schema.yaml") as f:
        schema = yaml.safe_load(f)
    validator = jsonschema.validators.validator_for(schema)(schema)
    cause = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if cause is None:
        raise
    where = ".".join(map(str, cause.absolute_path)) or "(top level)"
    raise WorkflowError(
        f"invalid workflow config at {where}: {cause.message} (see config/schema.yaml)"
    ) from None


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


# Cheap jobs run where Snakemake runs (never submitted to a cluster).
localrules:
    all,
    table1,
    table_seeds,
    table_heads,
    table_downstream,
    table_cost,
    figure,
    report,
    reproduce_table1,
    reproduce_seeds,
    reproduce_heads,
    reproduce_downstream,
    reproduce_cost,
    reproduce_cpt,


rule reproduce_table1:
    input:
        table_files("table1"),
        figure_files("loss_curves"),


rule reproduce_seeds:
    input:
        table_files("seeds"),


rule reproduce_heads:
    input:
        table_files("heads"),
        figure_files("head_sweep"),


rule reproduce_downstream:
    input:
        table_files("downstream"),


rule reproduce_cost:
    input:
        reproduce_cost_inputs,


rule reproduce_cpt:
    input:
        reproduce_cpt_inputs,
