"""``python -m mhar.train CONFIG [key=value ...] --out RUN_DIR``: the trainer's command (mhar.training.cli)."""
from mhar.training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
