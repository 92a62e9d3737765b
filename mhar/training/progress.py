"""What the trainer prints while it runs: a progress bar (tqdm on a TTY, periodic lines otherwise) and the
startup report (how long the cold start took, when the timed steps began, whether the compile cache was warm).
Rank 0 only; the numbers go into summary.json's ``startup`` record."""
from __future__ import annotations

import sys
import time
from typing import Callable

__all__ = ["Progressbar", "Startup"]


class Progressbar:
    """tqdm on a TTY, periodic log lines otherwise (rank 0 only)."""

    def __init__(self, total: int, start: int, every: int, enabled: bool, log: Callable[[str], None]):
        self.every, self.enabled, self.log, self.bar = every, enabled, log, None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm  # only on a terminal

            self.bar = tqdm(total=total, initial=start, dynamic_ncols=True)

    def update(self, step: int, row: dict, tok_s: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", tok_s=f"{tok_s:,.0f}")
        elif step % self.every == 0:
            self.log(f"step {step} loss {row['loss']:.4f} lr {row['lr']:.3e} gnorm {row['grad_norm']:.3f} "
                     f"tokens {row['tokens']:,} tok/s {tok_s:,.0f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Startup:
    """The cold start of a training segment: seconds from ``started`` to the first step (data, model,
    compilation, autotuning) and to the first timed step (``skip``: after warm-up and capture)."""

    def __init__(self, started: float, skip: int, compile_cache: dict, log: Callable[[str], None]):
        self.started, self.skip, self.log, self.steps = started, skip, log, 0
        self.record = {"first_step_s": None, "first_timed_step_s": None,
                       "compile_cache": compile_cache["env"]["TORCHINDUCTOR_CACHE_DIR"],
                       "compile_cache_warm": compile_cache["warm"]}

    def step_done(self) -> None:
        self.steps += 1
        r = self.record
        if self.steps == 1:
            r["first_step_s"] = round(time.time() - self.started, 3)
        if self.steps == self.skip:
            r["first_timed_step_s"] = round(time.time() - self.started, 3)
            self.log(f"startup: first step done {r['first_step_s']} s after the start, timed steps from "
                     f"{r['first_timed_step_s']} s (compile cache {r['compile_cache']}: "
                     f"{'warm' if r['compile_cache_warm'] else 'cold'})")
