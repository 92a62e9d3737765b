"""Stop on a signal at a step boundary: SIGTERM, SIGUSR1 (what SLURM sends before a time limit or at
preemption) and SIGINT (Ctrl-C) set a flag; the training loop checks it after each step, writes a
checkpoint and raises :class:`Preempted`. The CLI turns that into one stderr line ("stopped at step N
by SIGTERM; rerun to resume") and exit code :data:`EXIT_PREEMPTED`; running the same command again
resumes from that checkpoint.

A second SIGINT interrupts at once (KeyboardInterrupt; the last complete checkpoint stays valid).
Under ``torchrun`` the ranks agree: the flag is all-reduced (max) at every step boundary, so all ranks
stop after the same step even when only one of them received the signal.
"""
from __future__ import annotations

import signal
import threading
from typing import Optional

import torch
import torch.distributed as dist

from mhar.training.distributed import DistEnv

__all__ = ["EXIT_PREEMPTED", "STOP_SIGNALS", "Preempted", "StopSignals"]

EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: stopped early on request, a rerun resumes
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class Preempted(Exception):
    """Training stopped on a signal after ``step`` (a checkpoint of that step is on disk)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum
        super().__init__(f"stopped at step {step} by {signal.Signals(signum).name}; rerun to resume")


class StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` set a flag instead of ending the process.

    ``requested(env)`` is the signal to stop for (0: none), the same on every rank of ``env``. Outside the
    main thread (where handlers cannot be installed) it does nothing.
    """

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.signum = 0
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:  # Ctrl-C twice: stop now
            raise KeyboardInterrupt
        if not self.signum:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def requested(self, env: Optional[DistEnv] = None) -> int:
        return self.agreed(env)[0]

    def agreed(self, env: Optional[DistEnv], *flags: bool) -> tuple[int, ...]:
        """``(signal, *flags)``, each the largest over the ranks of ``env`` (one all-reduce under torchrun): a signal
        or a flag (another reason to stop after this step, e.g. a required tracker that failed on rank 0) that
        any rank has stops every rank after the same step."""
        values = [self.signum, *(int(f) for f in flags)]
        if env is None or not env.distributed:
            return tuple(values)
        t = torch.tensor(values, dtype=torch.int32, device=env.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # any rank's signal stops every rank after this step
        return tuple(int(v) for v in t.tolist())
