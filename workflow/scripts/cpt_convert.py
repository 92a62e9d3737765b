"""Convert the base to one arm's form (plain: baseline, mhar: mhar_delta), refusing anything not exact."""

import json
from pathlib import Path

import torch

from _glue import start
from mhar.cpt import CPTConfig, convert_hf_llama, cpt_config_from_dict, save_converted

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)
torch.set_num_threads(max(1, sm.threads))

cfg = cpt_config_from_dict(sm.config["cpt"])
arm = sm.wildcards.arm
model, report = convert_hf_llama(sm.params.src, cfg.heads, cfg.delta_block_layers, variant=CPTConfig.VARIANT[arm],
                                 revision=cfg.base.revision, check_seq_len=cfg.check_seq_len,
                                 routing_impl=cfg.routing_impl)
path = save_converted(model, report, Path(sm.output.model).parent, cfg.tokenizer)
log.info("converted %s -> %s (%s): max |logits - original| = %s in fp32 on %s tokens; %+d parameters",
         sm.params.src, path, report.variant, report.max_abs_diff, report.check_batch, report.params_added)
log.info("report: %s", json.dumps({k: v for k, v in report.to_dict().items() if k != "model_config"}))
