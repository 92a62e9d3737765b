"""Prove the two CPT arms saw byte-identical batches at every step (fails the job otherwise)."""

import json
from pathlib import Path

from _glue import start
from mhar.cpt import compare_batch_logs

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

report = compare_batch_logs(Path(sm.input.plain).parent, Path(sm.input.mhar).parent)
Path(sm.output[0]).write_text(json.dumps(report, indent=1) + "\n")
log.info("identical batches at all %d steps (sha256 of all: %s)", report["steps"], report["all_batches_sha256"])
