"""Train one run: write its resolved run config, launch ``python -m mhar.train``.

With ``resources.gpus_per_run > 1`` the trainer is launched under torchrun (DDP on
one node). Inputs: ``snakemake.params.run_config`` (dict), ``snakemake.params.gpus``.
"""

from pathlib import Path

from _glue import launcher, run_logged, start, with_data_dir
from mhar.runs.config import run_config_from_dict
from mhar.safe_yaml import dump_yaml

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

run_dir = Path(sm.output.summary).parent
cfg = with_data_dir(sm.params.run_config, sm)
run_config_from_dict(cfg)  # fail here, naming the field, before any process starts
cfg_path = Path(sm.log[0]).with_suffix(".run_config.yaml")
cfg_path.write_text(dump_yaml(cfg))
log.info("train %s (run config %s)", run_dir, cfg_path)

cmd = [*launcher(int(sm.params.gpus)), "-m", "mhar.train", cfg_path, "--out", run_dir]
run_logged(cmd, sm.log[0], threads=sm.threads)
for name in ("summary", "metrics", "model"):
    if not Path(sm.output[name]).is_file():
        raise RuntimeError(f"mhar.train finished but did not write {sm.output[name]}; see {sm.log[0]}")
log.info("done: %s", sm.output.summary)
try:  # results/runs/INDEX.md: every run folder with its label, seed, identity, status, metrics (mhar.runs.layout)
    from mhar.runs.layout import write_index

    log.info("index: %s", write_index(sm.config["results_dir"]))
except OSError as err:  # the run is done; a listing that cannot be written is not a failed job
    log.warning("could not refresh the runs index: %s", err)
