# Continued pretraining: config, paths and input functions of workflow/rules/cpt.smk
# (kept apart from the rules: `snakemake --lint` asks rules and functions not to share a file).

from mhar.cpt import CPTConfig, base_run_config, cpt_config_from_dict  # noqa: E402

try:
    CPT = cpt_config_from_dict(config["cpt"])
except ConfigError as err:
    raise WorkflowError(f"invalid cpt block: {err}")

check_task_names(CPT.eval.tasks, "cpt.eval.tasks")

CPT_ROOT = f"{RESULTS}/cpt/{config_hash(config['cpt'], 10)}"
CPT_LOGS = f"{LOGS}/cpt/{config_hash(config['cpt'], 10)}"
CPT_BENCHMARKS = f"{BENCHMARKS}/cpt/{config_hash(config['cpt'], 10)}"
CPT_EVAL_MODEL = {"base": "init/plain", "plain": "runs/plain", "mhar": "runs/mhar"}


def cpt_targets():
    return table_files("cpt")


def cpt_base_source(wildcards):
    """Input of a conversion: the exported stand-in base, or nothing for a hub/local HF base."""
    return [] if CPT.base.hf else [f"{CPT_ROOT}/base/hf/config.json"]


wildcard_constraints:
    arm="plain|mhar",
    cpt_model="base|plain|mhar",
