"""``mhar`` / ``python -m mhar``: one command with subcommands.

    mhar export-hf RUN_DIR --out HF_DIR        # Hugging Face directory (mhar.hf)
    mhar import-hf HF_DIR --out model.pt       # back into the harness (mhar.hf)
    mhar runs ...                              # run records (mhar.runs.layout)
    mhar train CONFIG --out RUN_DIR            # = python -m mhar.train
    mhar cpt convert|export-hf|check-batches   # = python -m mhar.cpt
    mhar presets                               # = python -m mhar.model.preset_table

Each subcommand is a ``module:function`` taking its argument list (``COMMANDS``); the module is
imported only when its subcommand runs, so a missing optional dependency affects that subcommand only.
"""
from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

COMMANDS: dict[str, str] = {
    "export-hf": "mhar.hf.cli:export_main",
    "import-hf": "mhar.hf.cli:import_main",
    "runs": "mhar.runs.layout:main",
    "train": "mhar.train:main",
    "cpt": "mhar.cpt.cli:main",
    "presets": "mhar.model.preset_table:main",
}
# What each subcommand does, for `mhar --help` (its own --help gives the arguments).
SUMMARIES: dict[str, str] = {
    "export-hf": "export a trained run as a Hugging Face folder (safetensors, config, tokenizer, model card)",
    "import-hf": "import a Hugging Face model (an export, stock Qwen3/Llama, the authors') as a model.pt",
    "runs": "list the run folders under results/ (label, size, seed, identity, step, loss; writes INDEX.md)",
    "train": "train one model from a run config (= python -m mhar.train)",
    "cpt": "continued pretraining of a released model: convert, export-hf, check-batches",
    "presets": "list the model sizes (presets) with their shapes and parameter counts",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {SUMMARIES.get(name, '')}" for name in COMMANDS)
    return ("usage: python -m mhar SUBCOMMAND [ARGS...]   (python -m mhar SUBCOMMAND --help for its arguments)\n\n"
            f"subcommands:\n{rows}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown subcommand {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            print(f"error: subcommand {name!r} needs module {module}, which this installation does not have "
                  f"(update mhar, or run it from a checkout that includes {module.replace('.', '/')}.py)",
                  file=sys.stderr)
            return 2
        raise
    fn = getattr(mod, func, None)
    if fn is None:
        print(f"error: subcommand {name!r}: {module} has no function {func}", file=sys.stderr)
        return 2
    rc = fn(rest)
    return int(rc) if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
