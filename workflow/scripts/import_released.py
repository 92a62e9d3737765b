"""Import one released checkpoint (config `released.<label>`) as a harness model.pt (mhar.hf.import_hf).

The source is pinned first (mhar.hf.hub.fetch): a hub name resolves to the commit its revision points at now, a
local folder to the hash of its files. That record goes into the run block (``source``) and so into every
evaluation's results.json, and into provenance.json beside model.pt. The run block (how evaluations are identified
and paired): label, the residual variant the checkpoint converts to, the arm's size label, seed 0, pairing
"released-<group>" (arms of one group pair), identity "released:<hf>@<commit or content hash>".

A hub that cannot be reached stops the job with one `error:` line naming the repository and how to give a local
copy instead; nothing is written."""

import json
import sys
from pathlib import Path

from _glue import start
from mhar.hf import import_hf
from mhar.hf.hub import HubUnreachable, NotACheckpoint, fetch
from mhar.runs.atomic import atomic_write_text

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

label, arm = sm.wildcards.label, sm.params.arm
out = Path(sm.output.model)
try:
    src = fetch(arm["hf"], arm.get("revision"))
except (HubUnreachable, NotACheckpoint) as e:
    hint = ""
    if isinstance(e, HubUnreachable):
        hint = (f"; to use a local copy, download it where the hub is reachable (hf download {e.repo} "
                f"--local-dir DIR), then set `released: {{{label}: {{hf: /absolute/DIR}}}}` in your overlay")
    msg = f"error: released arm {label!r}: {e}{hint}"
    with open(sm.log[0], "a") as f:  # the log and the terminal each get the one line (no logging prefix)
        f.write(msg + "\n")
    print(msg, file=sys.stderr)
    sys.exit(1)
log.info("source of %s: %s", label, src.describe())
pin = src.commit or src.content_sha256
run = {"label": label, "residual": None, "size": str(arm["size"]), "seed": 0, "data_seed": None,
       "pairing": f"released-{arm['group']}", "identity": f"released:{arm['hf']}@{pin}", "released": arm["hf"],
       "source": src.record()}
rep = import_hf(src.folder, out, tokenizer=arm.get("tokenizer"), run=run)
atomic_write_text(out.with_name("provenance.json"),
                  json.dumps({"released": label, "source": src.record(), "import_hf": rep}, indent=1, default=str))
log.info("imported %s (%s%s) as %s -> %s", src.describe(), rep["model_type"],
         f", attnres_mode {rep['attnres_mode']}" if rep.get("attnres_mode") else "", rep["variant"], out)
