"""Train one CPT arm: run config = shared cpt.train block + the converted model; launch mhar.training.train.

Both arms get identical data/train sections (batches, schedule, token budget), so the only
difference is the residual form. With cpt.gpus > 1 the trainer runs under torchrun.
"""

import json
from pathlib import Path

from _glue import launcher, run_logged, start, with_data_dir
from mhar.cpt import arm_run_config, cpt_config_from_dict
from mhar.runs.config import run_config_from_dict
from mhar.safe_yaml import dump_yaml

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

cfg = cpt_config_from_dict(sm.config["cpt"])
arm = sm.wildcards.arm
model_cfg = json.loads(Path(sm.input.report).read_text())["report"]["model_config"]
run_cfg = with_data_dir(arm_run_config(cfg, arm, model_cfg, str(Path(sm.input.init).resolve())), sm)
run_config_from_dict(run_cfg)  # fail here, naming the field, before any process starts
cfg_path = Path(sm.log[0]).with_suffix(".run_config.yaml")
cfg_path.write_text(dump_yaml(run_cfg))
run_dir = Path(sm.output.summary).parent
log.info("CPT arm %s from %s (run config %s)", arm, sm.input.init, cfg_path)
run_logged([*launcher(int(sm.params.gpus)), "-m", "mhar.train", cfg_path, "--out", run_dir], sm.log[0],
           threads=sm.threads)
for name in ("summary", "metrics", "model"):
    if not Path(sm.output[name]).is_file():
        raise RuntimeError(f"mhar.train finished but did not write {sm.output[name]}; see {sm.log[0]}")
