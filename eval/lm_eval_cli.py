"""``mhar-lm-eval``: lm-eval's own command line with the ``mhar`` model and our local task YAMLs.

    mhar-lm-eval --model mhar --model_args pretrained=RUN_DIR/model.pt,max_length=2048 \\
        --tasks lambada_openai,hellaswag --device cpu --batch_size 8 [--limit N] [--num_fewshot K] ...
    python -m eval.lm_eval_cli ...          # the same without the installed console script

Every flag and subcommand is lm-eval's (``lm_eval --help``; ``run`` is implied as in ``lm_eval``);
this wrapper only (1) registers ``--model mhar`` (``eval.adapter.MharLM``; lm-eval 0.4 does not
discover model plugins, so plain ``lm_eval --model mhar`` fails), and (2) when ``MHAR_DATA_DIR``
is set and no ``--include_path`` is given, adds ``--include_path eval/tasks``: the local-mirror YAMLs
then replace the stock tasks of the same names (same prompts, data from that directory). Without
``MHAR_DATA_DIR`` the stock hub tasks run. ``--model hf`` and every other lm-eval model work as in
``lm_eval``. Bad ``mhar`` model arguments and a missing checkpoint give one ``error:`` line, exit 2.
For per-document files in our format (samples.jsonl / results.json) use ``python -m eval.run``.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from .data_local import TASKS_DIR

_SUBCOMMANDS = ("run", "ls", "validate")


def cli_argv(argv: Sequence[str], data_dir: Optional[str]) -> list[str]:
    """lm-eval argv with the local task folder included when a data directory is set."""
    argv = list(argv)
    if data_dir and "--include_path" not in argv and (not argv or argv[0] in ("run", "ls", "validate")
                                                      or argv[0].startswith("-")):
        argv += ["--include_path", str(TASKS_DIR)]
    return argv


def main(argv: Optional[Sequence[str]] = None) -> int:
    from lm_eval.__main__ import cli_evaluate

    from . import adapter  # noqa: F401  registers "mhar" with lm-eval's model registry
    from mhar.checkpoint import CheckpointError

    args = cli_argv(sys.argv[1:] if argv is None else argv, os.environ.get("MHAR_DATA_DIR"))
    old = sys.argv
    sys.argv = [old[0] if old else "mhar-lm-eval", *args]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except (CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if not str(e).startswith("MharLM:"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        sys.argv = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
