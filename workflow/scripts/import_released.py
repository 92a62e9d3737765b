"""Import one released checkpoint (config `released.<label>`) as a harness model.pt (mhar.hf.import_hf).

Its run block (how its evaluations are identified and paired in the downstream table): label, the residual
variant the checkpoint converts to, the arm's size label, seed 0, pairing "released-<group>" (arms of one group pair), identity "released:<hf>"."""

from pathlib import Path

from _glue import start
from mhar.hf import import_hf

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

label, arm = sm.wildcards.label, sm.params.arm
out = Path(sm.output.model)
run = {"label": label, "residual": None, "size": str(arm["size"]), "seed": 0, "data_seed": None,
       "pairing": f"released-{arm['group']}", "identity": f"released:{arm['hf']}", "released": arm["hf"]}
rep = import_hf(arm["hf"], out, tokenizer=arm.get("tokenizer"), revision=arm.get("revision"), run=run)
log.info("imported %s (%s%s) as %s -> %s", arm["hf"], rep["model_type"],
         f", attnres_mode {rep['attnres_mode']}" if rep.get("attnres_mode") else "", rep["variant"], out)
