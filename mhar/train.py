"""``python -m mhar.train CONFIG [key=value ...] --out RUN_DIR``: the trainer's command (mhar.training.train)."""
from mhar.training.train import main

if __name__ == "__main__":
    raise SystemExit(main())
