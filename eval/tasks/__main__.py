"""``python -m eval.tasks``: print the folder to give stock lm-eval as ``--include_path``.

    lm_eval --model hf --model_args pretrained=EXPORT,trust_remote_code=True --tasks lambada_openai \\
        --include_path "$(python -m eval.tasks)"        # with MHAR_DATA_DIR set: offline, from the local mirror

The YAMLs of this folder define wikitext, lambada_openai, hellaswag, gsm8k and gpqa_main_zeroshot with lm-eval's
own prompts and the data of ``$MHAR_DATA_DIR`` (shared/data layout); without the include path lm-eval fetches
the hub datasets, which ends in a ConnectionError offline. ``--command`` prints such a command line instead.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from mhar import env

HERE = Path(__file__).resolve().parent


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.tasks", description=__doc__.split("\n\n")[0])
    p.add_argument("--command", metavar="EXPORT", default=None,
                   help="print a whole `lm_eval --model hf` command for this Hugging Face export folder instead")
    a = p.parse_args(argv)
    data = env.data_dir()
    if data is None:
        print("note: MHAR_DATA_DIR is not set; these tasks read their data from it (export MHAR_DATA_DIR=...)",
              file=sys.stderr)
    if a.command is None:
        print(HERE)
        return 0
    cmd = ["lm_eval", "--model", "hf", "--model_args", f"pretrained={a.command},trust_remote_code=True",
           "--tasks", "wikitext,lambada_openai,hellaswag", "--include_path", str(HERE), "--batch_size", "auto"]
    prefix = f"MHAR_DATA_DIR={shlex.quote(str(data))} " if data is not None else ""
    print(prefix + " ".join(shlex.quote(c) for c in cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
