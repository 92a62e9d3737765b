"""Import one released checkpoint (config `released.<label>`) as a harness model.pt (mhar.hf.import_hf).

The source is pinned first: a hub name is downloaded (or found in the hub cache) at its revision and recorded by
the commit of that snapshot, a local folder by the hash of its config and weights (mhar.hf.importer.hub_commit,
content_sha256). That record goes into the run block (``source``), so into every evaluation's results.json, and
into provenance.json beside model.pt with the import report. The run block (how evaluations are identified and
paired): label, the residual variant the checkpoint converts to, the arm's size label, seed 0, pairing
"released-<group>" (arms of one group pair), identity "released:<hf>@<commit or content hash>".

A hub that cannot be reached stops the job with one `error:` line naming the repository and how to give a local
copy instead; nothing is written."""

import json
import sys
from pathlib import Path

from _glue import start
from mhar.hf.importer import ImportHFError, content_sha256, hub_commit, import_hf, resolve_source
from mhar.atomic import atomic_write_text, file_sha256

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

label, arm = sm.wildcards.label, sm.params.arm
hf, revision = str(arm["hf"]), arm.get("revision")
out = Path(sm.output.model)


def fail(msg: str) -> None:
    """One `error:` line on the terminal and in the log (no logging prefix), exit 1."""
    line = f"error: released arm {label!r}: {msg}"
    with open(sm.log[0], "a") as f:
        f.write(line + "\n")
    print(line, file=sys.stderr)
    sys.exit(1)


try:
    folder, hub = resolve_source(hf, revision)
except ImportHFError as e:
    cause = e.__cause__
    if cause is None:  # a local path that is not a model folder
        fail(str(e))
    first = (str(cause).strip().splitlines() or [""])[0]
    at = f" at revision {revision!r}" if revision else ""
    fail(f"the Hugging Face hub repository {hf!r}{at} could not be reached ({type(cause).__name__}: {first}); to "
         f"use a local copy, download it where the hub is reachable (hf download {hf} --local-dir DIR), then set "
         f"`released: {{{label}: {{hf: /absolute/DIR}}}}` in your overlay")
weights = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.suffix in (".safetensors", ".bin")}
source = {"content_sha256": content_sha256(folder, weights)}
if hub is not None:
    source = {"kind": "hub", "repo": hub, "revision": revision, "commit": hub_commit(folder), **source}
else:
    source = {"kind": "local", "folder": str(folder.resolve()), "commit": hub_commit(folder), **source}
pin = source["commit"] or source["content_sha256"]
log.info("source of %s: %s", label, json.dumps(source))
run = {"label": label, "residual": None, "size": str(arm["size"]), "seed": 0, "data_seed": None,
       "pairing": f"released-{arm['group']}", "identity": f"released:{hf}@{pin}", "released": hf, "source": source}
tokenizer = arm.get("tokenizer")
if tokenizer is None and hub is not None and not (folder / "tokenizer.json").is_file():
    tokenizer = f"hf:{hub}"  # as import-hf names a hub model's tokenizer
try:
    rep = import_hf(folder, out, tokenizer=tokenizer, run=run)
except ImportHFError as e:
    fail(str(e))
atomic_write_text(out.with_name("provenance.json"),
                  json.dumps({"released": label, "source": source, "import_hf": rep}, indent=1, default=str))
log.info("imported %s (%s%s) as %s -> %s", hf, rep["model_type"],
         f", attnres_mode {rep['attnres_mode']}" if rep.get("attnres_mode") else "", rep["variant"], out)
