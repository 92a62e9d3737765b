"""Training: ``python -m mhar.train CONFIG [key=value ...] --out RUN_DIR [--stop-after K]``.

The trainer's command line (``mhar/train.py`` runs :func:`main`; ``mhar train`` is the same): it loads the run
config, prints it with ``--print-config``, or trains with :func:`mhar.training.train.train` and turns the
expected failures into one stderr line and an exit code: 2 for a config, data, run-folder, checkpoint,
divergence or disk error (or a tracker that failed under ``train.tracking_required``),
:data:`mhar.training.preemption.EXIT_PREEMPTED` when a signal stopped the run at a checkpoint, 130 for Ctrl-C.
"""
from __future__ import annotations

import time

_IMPORT_TIME = time.time()  # `python -m mhar.train`: the startup report counts from here

import argparse
import sys
from typing import Optional, Sequence

from mhar.data.corpus import DataError
from mhar.model.config import ConfigError
from mhar.atomic import os_error_line
from mhar.runs.checkpoint import CheckpointError
from mhar.runs.config import identity_hash, load_run_config, pairing_hash
from mhar.runs.run_dir import RunDirError
from mhar.safe_yaml import dump_yaml
from mhar.training.distributed import launch_rank
from mhar.training.preemption import EXIT_PREEMPTED, Preempted
from mhar.training.tracking import TrackingError
from mhar.training.train import TrainingDiverged, train

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhar.train", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="run config YAML (see config/train/)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.lr=3e-4")
    p.add_argument("--out", required=True, help="run directory (created; resumed if it holds this config)")
    p.add_argument("--stop-after", type=int, default=None, help="checkpoint and exit after this step")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config, its run identity and pairing hash, then exit")
    args = p.parse_args(argv)
    try:
        # a variant override's dropped knobs: one warning line, said once under torchrun (rank 0)
        cfg = load_run_config(args.config, args.overrides,
                              warn=lambda m: print(m, file=sys.stderr) if launch_rank() == 0 else None)
        if args.print_config:
            print(dump_yaml(cfg.to_dict()) + f"# identity: {identity_hash(cfg)}\n# pairing: {pairing_hash(cfg)}")
            return 0
        train(cfg, args.out, stop_after=args.stop_after, started=_IMPORT_TIME)
    except Preempted as e:  # a checkpoint of step e.step is on disk
        if launch_rank() == 0:
            print(e, file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:  # Ctrl-C twice (or before training began): no traceback
        print(f"interrupted; completed checkpoints in {args.out} are kept: run the same command again to resume",
              file=sys.stderr)
        return 130
    except TrackingError as e:  # a damaged tracking.json, or a required tracker failed (rank 0 says which)
        if launch_rank() == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, DataError, RunDirError, CheckpointError, TrainingDiverged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only, no permission: records are atomic, so nothing complete is lost
        print("error: " + os_error_line(e, "training", f"completed checkpoints and records in {args.out} are kept; "
                                        "fix that, then run the same command again to resume"), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
