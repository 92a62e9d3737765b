"""CPT table: CPT gain (plain - base), total gain (MHAR - base), MHAR gain (MHAR - plain) + McNemar p."""

import json
from pathlib import Path

from _glue import start
from analysis.tables.build import write_cpt_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

# .../eval/<model>/<task>/results.json -> .../eval/<model>
dirs = {Path(p).parent.parent.name: Path(p).parent.parent for p in sm.input.results}
prefix = Path(sm.output[0]).with_suffix("")
check = json.loads(Path(sm.input.batch_check).read_text())
for path in write_cpt_table(dirs["base"], dirs["plain"], dirs["mhar"], prefix, sm.params.scale, check,
                            n_resamples=sm.params.resamples, published=dict(sm.params.published)):
    log.info("wrote %s", path)
