"""Mechanism probe of one trained routed model with eval.probe.run_probe; writes the probe JSON."""

from _glue import data_dir, start
from eval.probe import run_probe

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

res = run_probe(sm.input[0], sm.output[0], slices=sm.params.slices, data_dir=data_dir(sm))
log.info("probe %s: %s", sm.input[0], {k: v for k, v in res.items() if isinstance(v, (int, float, str))})
