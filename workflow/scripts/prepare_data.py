"""Build (or find) the token shards of a run config's data block; record their metadata."""

import json
import os
from pathlib import Path

from _glue import start, with_data_dir
from mhar.data.shards import build_shards
from mhar.env import TOKENIZE_WORKERS_ENV
from mhar.runs.config import run_config_from_dict

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

cfg = run_config_from_dict(with_data_dir(sm.params.run_config, sm))
# the job's threads are the tokenizer's worker processes (MHAR_TOKENIZE_WORKERS, when set, wins:
# build_shards reads it when workers is None)
workers = None if os.environ.get(TOKENIZE_WORKERS_ENV, "").strip() else max(1, int(sm.threads))
shards = build_shards(cfg.data, cfg.model.vocab_size, log=log.info, workers=workers)
record = {"cache_dir": str(shards.path) if shards.path else None, **shards.meta}
Path(sm.output[0]).write_text(json.dumps(record, indent=1, default=str))
log.info("shards ready: %s", record["cache_dir"])
