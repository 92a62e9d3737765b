# Workflow config: the defaults, your overlays, --config values as YAML, the schema, the reports folder.
# (Included first by the Snakefile; functions only, no rules: `snakemake --lint`.)
#
# Snakemake's convention: the workflow's defaults (config/config.yaml + config/cpt.yaml) load first and
# every --configfile, then --config, applies on top (mappings merge key by key; lists and scalars replace).
# A complete config - one naming every required key of config/schema.yaml (config/paper.yaml,
# config/gpu_small.yaml, config/ci.yaml) - stands on its own instead of merging into the defaults, and so
# does any config with --replace-workflow-config (Snakemake's flag for exactly that).

import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import update_config, validate

# The repository root holds the `mhar` and `eval` packages (common.smk: run identities and paths).
if str(Path(workflow.basedir).resolve()) not in sys.path:
    sys.path.insert(0, str(Path(workflow.basedir).resolve()))

from mhar.model.choices import brief  # noqa: E402
from mhar.model.config import config_hash  # noqa: E402
from mhar.safe_yaml import (
    YAMLRefused,
    read_yaml_file,
    yaml_error_line,
    yaml_load,
)  # noqa: E402


def _config_error(msg):
    """One `error:` line and exit 1 (a WorkflowError would add Snakemake's file/line trace)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def _read_yaml(path):
    """A config file through mhar.safe_yaml: a document over the size limit or with aliases that expand past
    its bound is refused in one line before anything walks the value."""
    try:
        return read_yaml_file(path) or {}
    except OSError as err:
        _config_error(f"cannot read config file {path}: {err.strerror or err}")
    except yaml.YAMLError as err:
        _config_error(f"cannot read config file {path}: {yaml_error_line(err)}")


SCHEMA = _read_yaml(Path(workflow.basedir) / "config/schema.yaml")
GIVEN = [Path(p) for p in workflow.overwrite_configfiles]
# Every overlay is read once through the bounded loader before anything else walks Snakemake's copy of it
# (the schema check would expand a "billion laughs" document).
_GIVEN_CONFIGS = {p: _read_yaml(p) for p in GIVEN}
# A complete config stands alone; any other --configfile (and --config) is an overlay on the defaults.
STANDALONE = getattr(workflow.config_settings, "replace_workflow_config", False) or any(
    set(SCHEMA["required"]) <= set(_GIVEN_CONFIGS[p]) for p in GIVEN
)
if not STANDALONE:

    configfile: f"{workflow.basedir}/config/config.yaml"
    configfile: f"{workflow.basedir}/config/cpt.yaml"


# --config values as YAML (Snakemake reads numbers itself but leaves list and mapping items as strings:
# seeds=[0,1] would arrive as ['0', '1']). Applied last, so --config still wins over every file.
CONFIG_ARGS = list(getattr(workflow.config_settings, "config_args", None) or [])
for _arg in CONFIG_ARGS:
    _key, _sep, _value = str(_arg).partition("=")
    if not _sep:
        continue
    try:  # one value on the command line: no alias is needed in it
        update_config(
            config,
            {_key: yaml_load(_value, aliases=False) if _value != "" else None},
        )
    except yaml.YAMLError as err:
        _shown = _arg if len(_arg) <= 100 and _arg.isprintable() else brief(_arg)
        _what = "refused" if isinstance(err, YAMLRefused) else "not valid YAML"
        _config_error(
            f"--config {_shown}: the value is {_what} ({yaml_error_line(err)})"
        )


# On a schema error snakemake prints the whole schema: name the field and the problem instead.
try:
    validate(config, f"{workflow.basedir}/config/schema.yaml")
except WorkflowError:
    import jsonschema

    validator = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)
    cause = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if cause is None:
        raise
    where = ".".join(map(str, cause.absolute_path)) or "(top level)"
    # jsonschema's message quotes the whole value: quote a bounded prefix; a label's rule says what it may be
    message = cause.message.replace(repr(cause.instance), brief(cause.instance))
    allowed = cause.schema.get("properties") or {}
    unexpected = sorted(set(cause.instance) - set(allowed), key=str) if allowed else []
    if cause.validator == "additionalProperties" and unexpected:
        # A typo, top level or nested (stats.resamplez): the key path and the keys allowed there.
        first = unexpected[0]
        if not (isinstance(first, str) and len(first) <= 60 and first.isprintable()):
            first = brief(first)
        where = ".".join([*map(str, cause.absolute_path), first])
        message = (
            f"unknown key{'s' if len(unexpected) > 1 else ''} {', '.join(map(brief, unexpected[:5]))}; "
            f"allowed: {', '.join(allowed)}"
        )
    if cause.validator in ("pattern", "maxLength") and isinstance(cause.schema, dict):
        if cause.schema.get("description"):
            message = (
                f"{brief(cause.instance)} is not allowed: {cause.schema['description']}"
            )
    hint = ""
    if cause.validator == "required" and not cause.absolute_path and STANDALONE:
        hint = (
            "; --replace-workflow-config makes the given files the whole config: drop it to apply them "
            "on top of config/config.yaml"
        )
    _config_error(
        f"invalid workflow config at {where}: {message} (see config/schema.yaml){hint}"
    )


# The config's published: block names tables of analysis/tables/registry.py (the schema leaves its keys to the
# registry) and sources of analysis/published_sources.csv: refused now, not in the table job; a table it leaves
# out quotes its record's default source (filled in here, as the schema fills its defaults).
def _check_published_sources():
    import csv

    sys.path.insert(0, str(Path(workflow.basedir).resolve()))
    from analysis.tables.registry import check_published, default_sources

    with open(
        Path(workflow.basedir) / "analysis" / "published_sources.csv", newline=""
    ) as f:
        known = [row["id"] for row in csv.DictReader(f)]
    problem = check_published(config.get("published"), known)
    if problem:
        _config_error(problem)
    config["published"] = {**default_sources(), **(config.get("published") or {})}


_check_published_sources()


# The committed reports/ folders belong to the config files under config/ that name them (reports/ to
# the defaults): a run with anything of yours on top (an overlay file outside config/, or --config) that
# does not set reports_dir itself writes its tables to <results_dir>/reports/<config hash> instead.
# (Where the jobs run and on what - data_dir, resources, results_dir - changes no table, nor does which
# experiment trackers receive a copy of the metrics, nor which target is built when none is named.)
EXECUTION_KEYS = (
    "data_dir",
    "resources",
    "results_dir",
    "tracking",
    "eval_wandb_args",
    "target",
)


def study_hash():
    """The config's results hash: everything but EXECUTION_KEYS and reports_dir (the overlay reports folder's
    name, the experiment trackers' group of its runs)."""
    study = {
        k: v for k, v in config.items() if k not in (*EXECUTION_KEYS, "reports_dir")
    }
    return config_hash(study, 8)


def _own_reports_dir():
    config_dir = (Path(workflow.basedir) / "config").resolve()
    keys = set()
    for p in GIVEN:
        if p.resolve().parent != config_dir:
            keys |= set(_GIVEN_CONFIGS[p])
    keys |= {str(a).partition("=")[0] for a in CONFIG_ARGS}
    if "reports_dir" in keys or keys <= set(EXECUTION_KEYS):
        return None
    return f"{config['results_dir'].rstrip('/')}/reports/{study_hash()}"


_reports = _own_reports_dir()
if _reports:
    logger.info(
        f"reports of this config (an overlay on {config['reports_dir']}): {_reports}"
    )
    config["reports_dir"] = _reports


onsuccess:
    # Said again at the end, where a reader of a long run looks: an overlay's tables are not in reports/.
    if _reports:
        print(
            f"reports of this config: {_reports}/ (an overlay: reports/ is left as it was)",
            file=sys.stderr,
        )
